/* monitored_barrier: a barrier that says which ranks did not arrive (c10d's Gloo monitoredBarrier).
 *
 * It runs over the group's store rather than the backend, so that it works on every backend and
 * leaves nothing posted behind when a rank never comes: each rank other than 0 sets its
 * "arrived" key; rank 0 waits for each in turn until the deadline and then sets a "release" key
 * to "ok" or to the failure message, which the other ranks wait for. Rank 0 fails with c10d's
 * words; the other ranks fail with the same message at once instead of running into their own
 * timeout. Keys live under "monitored_barrier/<n>/" of the group's store, n counting the calls. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/error.h"
#include "pg/pg_impl.h"

static td_status wait_key(td_store *store, const char *key, int64_t deadline_ns, td_status *timed_out)
{
    int64_t left = deadline_left_ms(deadline_ns);
    td_status st;
    if (left <= 0) {
        bool ready = false;
        st = td_store_check(store, &key, 1, &ready);
        if (st == TD_OK && !ready)
            st = error_fmt(TD_ERR_TIMEOUT, "Wait timeout");
    } else {
        st = td_store_wait(store, &key, 1, left == INT64_MAX ? TD_STORE_NO_TIMEOUT : left);
    }
    *timed_out = st;
    return st;
}

td_status td_pg_monitored_barrier(td_pg *pg, int64_t timeout_ms, bool wait_all_ranks)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "monitored_barrier", &g));
    if (timeout_ms < 0)
        return error_fmt(TD_ERR_INVALID, "monitored_barrier: timeout must be >= 0 ms, got %lld", (long long)timeout_ms);
    if (g->local_store)
        return error_fmt(TD_ERR_UNSUPPORTED,
                        "monitored_barrier runs over the group's store, and this %s group has no store its ranks "
                        "share (its backend needs none): give td_pg_create an options.store to use it",
                        g->backend_name);
    if (timeout_ms == 0)
        timeout_ms = g->timeout_ms;
    pthread_mutex_lock(&g->mu);
    uint64_t n = ++g->monitored_seq;
    td_status failed = g->failed;
    char *failed_msg = failed != TD_OK ? alloc_strdup(g->failed_msg) : NULL;
    pthread_mutex_unlock(&g->mu);
    if (failed != TD_OK) {
        error_set(failed, failed_msg);
        free(failed_msg);
        return failed;
    }
    char key[128], release[128];
    snprintf(release, sizeof release, "monitored_barrier/%llu/release", (unsigned long long)n);
    int64_t deadline = deadline_after_ms(timeout_ms);

    if (g->rank != 0) {
        snprintf(key, sizeof key, "monitored_barrier/%llu/arrived/%d", (unsigned long long)n, g->rank);
        TD_TRY(td_store_set_str(g->store, key, "1"));
        /* Rank 0 may take the whole timeout before it answers. */
        td_status timed_out;
        if (wait_key(g->store, release, deadline_after_ms(2 * timeout_ms + 1000), &timed_out) != TD_OK)
            return error_prefix(timed_out, "[Rank %d]: rank 0 did not release monitoredBarrier within %lld ms",
                                   g->rank, (long long)(2 * timeout_ms + 1000));
        void *v = NULL;
        size_t len = 0;
        TD_TRY(td_store_get(g->store, release, &v, &len));
        td_status st = TD_OK;
        if (strcmp(v, "ok") != 0)
            st = error_fmt(TD_ERR_TIMEOUT, "%s", (char *)v);
        free(v);
        return st;
    }

    td_buf missing = TD_BUF_INIT;
    int nmissing = 0;
    char first_error[512] = "";
    for (int r = 1; r < g->size; r++) {
        snprintf(key, sizeof key, "monitored_barrier/%llu/arrived/%d", (unsigned long long)n, r);
        td_status st;
        if (wait_key(g->store, key, deadline, &st) == TD_OK)
            continue;
        if (!nmissing)
            snprintf(first_error, sizeof first_error, "%s", td_last_error());
        buf_printf(&missing, "%s%d", nmissing ? ", " : "", r);
        nmissing++;
        if (!wait_all_ranks)
            break;
    }
    if (!nmissing) {
        buf_free(&missing);
        return td_store_set_str(g->store, release, "ok");
    }
    char *msg = nmissing == 1 && !wait_all_ranks
                    ? alloc_printf("[Rank 0]: Rank %s failed to pass monitoredBarrier in %lld ms\n Original exception: \n%s",
                                  missing.data, (long long)timeout_ms, first_error)
                    : alloc_printf("[Rank 0]: Ranks %s failed to pass monitoredBarrier in %lld ms", missing.data,
                                  (long long)timeout_ms);
    buf_free(&missing);
    td_store_set_str(g->store, release, msg);
    td_status st = error_fmt(TD_ERR_TIMEOUT, "%s", msg);
    free(msg);
    return st;
}
