/* td_mp_pool: multiprocessing.Pool's map in C. N workers (started with td_mp_spawn, fork or spawn)
 * run the registered entry "td_mp_pool_worker": they take (task id, entry, argument) tuples from a
 * task queue, run the entry, and put (task id, ok, result or error message) on a result queue. map
 * puts one task per element (chunksize 1) and collects the results by id, so their order is the
 * arguments' order; while it waits it also watches the workers, so one that dies fails the call
 * instead of hanging it. close sends each worker a None to stop on. Workers are daemonic (killed
 * with the thread that made the pool), and the pool refuses to be used from a forked child. */
#include <stdlib.h>
#include <string.h>

#include <tdist/mp.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/fork.h"
#include "mp/message.h"

struct td_mp_pool {
    td_fork_guard guard;
    td_mp_queue *tasks, *results;
    td_mp_context *workers;
    int n;
    int64_t next_id;
    bool closed, joined, broken;
};

TD_MP_ENTRY(td_mp_pool_worker)
{
    td_mp_queue *tasks = td_mp_value_queue(td_value_at(args, 0));
    td_mp_queue *results = td_mp_value_queue(td_value_at(args, 1));
    if (!tasks || !results)
        return error_fmt(TD_ERR_INVALID, "td_mp_pool_worker: arguments are not (task queue, result queue)");
    for (;;) {
        td_value *task = NULL;
        TD_TRY(td_mp_queue_get(tasks, 0, &task));
        if (td_value_kind_of(task) == TD_VAL_NONE) {
            td_value_release(task);
            break;
        }
        int64_t id = td_value_get_int(td_value_at(task, 0));
        const char *entry = td_value_get_string(td_value_at(task, 1), NULL);
        td_mp_entry_fn fn = td_mp_entry_find(entry);
        td_value *res = NULL;
        td_status st = fn ? fn(rank, td_value_at(task, 2), &res)
                          : error_fmt(TD_ERR_NOT_FOUND, "entry point '%s' is not registered in the worker", entry);
        td_value *reply;
        if (st == TD_OK) {
            reply = td_value_tuple_of(3, td_value_int(id), td_value_bool(true), res ? res : td_value_none());
        } else {
            td_value_release(res);
            const char *m = td_last_error();
            reply = td_value_tuple_of(3, td_value_int(id), td_value_bool(false),
                                      td_value_string(*m ? m : td_status_str(st)));
        }
        td_value_release(task);
        st = td_mp_queue_put(results, reply, 0);
        td_value_release(reply);
        TD_TRY(st);
    }
    return td_mp_queue_close(results);
}

td_status td_mp_pool_new(int nworkers, td_mp_start_method method, td_mp_pool **out)
{
    if (!out || nworkers <= 0)
        return error_fmt(TD_ERR_INVALID, "td_mp_pool_new: need at least one worker, got %d", nworkers);
    td_mp_pool *p = TD_NEW(td_mp_pool);
    fork_guard_init(&p->guard);
    p->n = nworkers;
    td_status st = td_mp_queue_new(0, &p->tasks);
    if (st == TD_OK)
        st = td_mp_queue_new(0, &p->results);
    if (st == TD_OK) {
        td_value *args = td_value_tuple_of(2, td_mp_queue_value(p->tasks), td_mp_queue_value(p->results));
        td_mp_spawn_opts o = {.entry = "td_mp_pool_worker", .args = args, .nprocs = nworkers, .method = method,
                              .daemon = true};
        st = td_mp_spawn(&o, &p->workers);
        td_value_release(args);
    }
    if (st != TD_OK) {
        td_mp_queue_release(p->tasks);
        td_mp_queue_release(p->results);
        free(p);
        return error_prefix(st, "td_mp_pool_new");
    }
    *out = p;
    return TD_OK;
}

int td_mp_pool_size(const td_mp_pool *p) { return p ? p->n : 0; }
pid_t td_mp_pool_pid(const td_mp_pool *p, int worker) { return p ? td_mp_context_pid(p->workers, worker) : -1; }

/* TD_OK while every worker runs; else the error naming the first that stopped. */
static td_status check_workers(td_mp_pool *p)
{
    for (int i = 0; i < p->n; i++) {
        int code;
        if (td_mp_exitcode(p->workers, i, &code) == TD_OK) {
            p->broken = true;
            return error_fmt(TD_ERR_PEER_LOST, "td_mp_pool_map: pool worker %d (pid %d) exited (%s %d) while tasks "
                                              "were pending; terminate the pool",
                            i, (int)td_mp_pool_pid(p, i), code < 0 ? "signal" : "exit code", code < 0 ? -code : code);
        }
    }
    return TD_OK;
}

td_status td_mp_pool_map(td_mp_pool *p, const char *entry, const td_value *args, td_value **results)
{
    if (!p || !entry || !args || !results)
        return error_fmt(TD_ERR_INVALID, "td_mp_pool_map: NULL argument");
    TD_TRY(fork_guard_check(&p->guard, "a td_mp_pool"));
    td_value_kind k = td_value_kind_of(args);
    if (k != TD_VAL_LIST && k != TD_VAL_TUPLE)
        return error_fmt(TD_ERR_INVALID, "td_mp_pool_map: args must be a list or tuple, got %s", td_value_kind_name(k));
    if (p->closed || p->broken)
        return error_fmt(TD_ERR_CLOSED, "td_mp_pool_map: Pool not running");
    if (!td_mp_entry_find(entry))
        return error_fmt(TD_ERR_NOT_FOUND, "td_mp_pool_map: no entry point named '%s' is registered (TD_MP_ENTRY)", entry);
    size_t n = td_value_len(args);
    int64_t base = p->next_id;
    p->next_id += (int64_t)n;
    for (size_t i = 0; i < n; i++) {
        td_value *task = td_value_tuple_of(3, td_value_int(base + (int64_t)i), td_value_string(entry),
                                           td_value_retain(td_value_at(args, i)));
        td_status st = td_mp_queue_put(p->tasks, task, 0);
        td_value_release(task);
        if (st != TD_OK) {
            p->broken = true; /* some tasks are out and their results would confuse the next map */
            return error_prefix(st, "td_mp_pool_map: queueing task %zu", i);
        }
    }
    td_value **got = TD_NEW_ARRAY(td_value *, n + 1);
    size_t ngot = 0;
    td_status st = TD_OK;
    while (ngot < n) {
        td_value *r = NULL;
        st = td_mp_queue_get(p->results, 200, &r);
        if (st == TD_ERR_TIMEOUT) {
            st = check_workers(p);
            if (st != TD_OK)
                break;
            continue;
        }
        if (st != TD_OK)
            break;
        int64_t id = td_value_kind_of(r) == TD_VAL_TUPLE && td_value_len(r) == 3 ? td_value_get_int(td_value_at(r, 0)) : -1;
        if (id < base || id >= base + (int64_t)n || got[id - base]) {
            td_value_release(r);
            continue; /* a late result of an earlier, failed map */
        }
        got[id - base] = r;
        ngot++;
    }
    if (st == TD_OK) {
        td_value *list = td_value_list_new();
        for (size_t i = 0; i < n && st == TD_OK; i++) {
            if (td_value_get_bool(td_value_at(got[i], 1)))
                td_value_list_append(list, td_value_retain(td_value_at(got[i], 2)));
            else
                st = error_fmt(TD_ERR_REMOTE, "td_mp_pool_map: task %zu (%s) failed in a pool worker: %s", i, entry,
                              td_value_get_string(td_value_at(got[i], 2), NULL));
        }
        if (st == TD_OK)
            *results = list;
        else
            td_value_release(list);
    }
    for (size_t i = 0; i < n; i++)
        td_value_release(got[i]);
    free(got);
    return st;
}

td_status td_mp_pool_close(td_mp_pool *p)
{
    if (!p)
        return error_fmt(TD_ERR_INVALID, "td_mp_pool_close: pool is NULL");
    TD_TRY(fork_guard_check(&p->guard, "a td_mp_pool"));
    if (p->closed)
        return TD_OK;
    p->closed = true;
    td_value *none = td_value_none();
    td_status st = TD_OK;
    for (int i = 0; i < p->n && st == TD_OK; i++)
        st = td_mp_queue_put(p->tasks, none, 0);
    td_value_release(none);
    return st;
}

td_status td_mp_pool_join(td_mp_pool *p, int64_t timeout_ms)
{
    if (!p)
        return error_fmt(TD_ERR_INVALID, "td_mp_pool_join: pool is NULL");
    TD_TRY(fork_guard_check(&p->guard, "a td_mp_pool"));
    if (!p->closed)
        return error_fmt(TD_ERR_INVALID, "td_mp_pool_join: close the pool first (Pool is still running)");
    TD_TRY(td_mp_join(p->workers, timeout_ms));
    p->joined = true;
    return TD_OK;
}

void td_mp_pool_terminate(td_mp_pool *p)
{
    if (!p)
        return;
    p->closed = true;
    td_mp_terminate(p->workers, 0);
}

void td_mp_pool_release(td_mp_pool *p)
{
    if (!p)
        return;
    if (!p->joined)
        mp_queue_cancel_join(p->tasks); /* workers that are gone will not take what is left */
    td_mp_context_release(p->workers); /* terminates workers still running */
    td_mp_queue_release(p->tasks);
    td_mp_queue_release(p->results);
    free(p);
}
