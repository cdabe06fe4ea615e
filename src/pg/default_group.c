/* The default group: torch.distributed's module-level API (init_process_group, get_rank,
 * new_group, destroy_process_group) as a convenience over explicit td_pg handles.
 *
 * It is the one piece of process-global state of the pg layer: a pointer to the default group and
 * the list of groups td_new_group made from it, which td_destroy_process_group destroys with it
 * (newest first, as c10d shuts down its groups). Passing NULL as the group to any td_pg_ call means
 * the default group. Programs hosting several worlds in one process (the threaded harness) use
 * explicit handles instead.
 *
 * It sits on top of pg.c: it makes and destroys groups through pg.c, and tells pg.c which group a
 * NULL argument means (pg_set_default_group); nothing below calls into this file. td_pg_destroy
 * lives here because destroying the default group destroys its subgroups with it. */
#include <pthread.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/log.h"
#include "base/vec.h"
#include "pg/pg_impl.h"

static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER; /* serializes init and destroy */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;      /* guards the two below */
static td_pg *g_default;     /* pg.c has it too, for the calls that name no group */
static TD_VEC(td_pg *) g_groups;

static td_status not_initialized(void)
{
    return error_fmt(TD_ERR_NOT_INIT, "Default process group has not been initialized, please make sure to call "
                                     "init_process_group.");
}

td_status td_init_process_group(const td_pg_options *options)
{
    pthread_mutex_lock(&g_init_mu);
    if (pg_default_group()) {
        pthread_mutex_unlock(&g_init_mu);
        return error_fmt(TD_ERR_ALREADY, "trying to initialize the default process group twice!");
    }
    td_pg *pg;
    td_status st = td_pg_create(options, &pg);
    if (st == TD_OK) {
        pthread_mutex_lock(&g_mu);
        g_default = pg;
        pg_set_default_group(pg);
        pthread_mutex_unlock(&g_mu);
    }
    pthread_mutex_unlock(&g_init_mu);
    return st;
}

void td_destroy_process_group(void)
{
    pthread_mutex_lock(&g_init_mu);
    pthread_mutex_lock(&g_mu);
    td_pg *def = g_default;
    g_default = NULL;
    pg_set_default_group(NULL);
    td_pg **groups = g_groups.items;
    size_t n = g_groups.len;
    g_groups.items = NULL;
    g_groups.len = g_groups.cap = 0;
    pthread_mutex_unlock(&g_mu);
    for (size_t i = n; i-- > 0;)
        pg_destroy_now(groups[i]);
    free(groups);
    if (def)
        pg_destroy_now(def);
    pthread_mutex_unlock(&g_init_mu);
}

/* For td_pg_destroy: true when pg is the default group, which was then destroyed with its
 * subgroups; otherwise pg is forgotten by the default group's list (if there) and false. */
static bool claim_destroy(td_pg *pg)
{
    pthread_mutex_lock(&g_mu);
    if (pg == g_default) {
        pthread_mutex_unlock(&g_mu);
        td_destroy_process_group();
        return true;
    }
    for (size_t i = 0; i < g_groups.len; i++) {
        if (g_groups.items[i] == pg) {
            for (size_t j = i + 1; j < g_groups.len; j++)
                g_groups.items[j - 1] = g_groups.items[j];
            g_groups.len--;
            break;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return false;
}

bool td_is_initialized(void) { return pg_default_group() != NULL; }

td_pg *td_default_pg(void) { return pg_default_group(); }

int td_get_rank(void)
{
    td_pg *pg = pg_default_group();
    return pg ? td_pg_rank(pg) : -1;
}

int td_get_world_size(void)
{
    td_pg *pg = pg_default_group();
    return pg ? td_pg_size(pg) : -1;
}

td_status td_new_group(const int *ranks, int n, const td_pg_options *options, td_pg **out)
{
    td_pg *def = pg_default_group();
    if (!def)
        return not_initialized();
    td_pg *pg;
    TD_TRY(td_pg_new_group(def, ranks, n, options, &pg));
    pthread_mutex_lock(&g_mu);
    TD_VEC_PUSH(&g_groups, pg);
    pthread_mutex_unlock(&g_mu);
    if (out)
        *out = pg;
    return TD_OK;
}

void td_pg_destroy(td_pg *pg)
{
    if (!pg)
        return;
    /* An inherited copy cannot be torn down: its worker thread stayed in the parent and its locks
     * may be held. Leave it to the process's exit rather than hang joining a thread that is not
     * there. */
    if (fork_guard_check(&pg->guard, "a process group") != TD_OK) {
        TD_LOG_WARN("td_pg_destroy: %s; the inherited copy is left alone", td_last_error());
        return;
    }
    if (claim_destroy(pg))
        return;
    pg_destroy_now(pg);
}
