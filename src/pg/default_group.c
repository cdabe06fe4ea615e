/* The default group: torch.distributed's module-level API (init_process_group, get_rank,
 * new_group, destroy_process_group) as a convenience over explicit td_pg handles.
 *
 * It is the one piece of global state of the pg layer: a world (pg_impl.h's pg_world), that is a
 * pointer to the default group and the list of groups td_new_group made from it, which
 * td_destroy_process_group destroys with it (newest first, as c10d shuts down its groups). Passing
 * NULL as the group to any td_pg_ call means the default group. The process has one world; a rank
 * thread of the threaded test harness has its own (pg_thread_world_begin / _end, called by
 * src/testing/thread_ranks.c), so that code using the default group runs with ranks as threads,
 * as PyTorch's MultiThreadedTestCase swaps in a thread-local world. Every other thread, including
 * those a rank thread starts, uses the process's world.
 *
 * It sits on top of pg.c: it makes and destroys groups through pg.c, and tells pg.c which group a
 * NULL argument means (pg_set_default_group, pg_set_thread_world); nothing below calls into this
 * file. td_pg_destroy lives here because destroying the default group destroys its subgroups with
 * it. */
#include <pthread.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "base/vec.h"
#include "pg/pg_impl.h"

/* The process's world: init and destroy are serialized, g_mu guards g_process (whose default
 * group pg.c has too, for the calls that name no group). A rank thread's own world takes neither
 * lock: only its thread touches it, and its peers initialize at the same time (a rendezvous that
 * holds a process-wide lock would wait for ranks that wait for the lock). */
static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pg_world g_process;

static td_status not_initialized(void)
{
    return error_fmt(TD_ERR_NOT_INIT, "Default process group has not been initialized, please make sure to call "
                                     "init_process_group.");
}

/* The calling thread's world, locked when it is the process's. */
static pg_world *world_lock(void)
{
    pg_world *own = pg_thread_world();
    if (own)
        return own;
    pthread_mutex_lock(&g_mu);
    return &g_process;
}

static void world_unlock(pg_world *w)
{
    if (w == &g_process)
        pthread_mutex_unlock(&g_mu);
}

/* Serializes init and destroy of the process's world; nothing for a thread's own. */
static bool init_lock(void)
{
    bool process = pg_thread_world() == NULL;
    if (process)
        pthread_mutex_lock(&g_init_mu);
    return process;
}

static void init_unlock(bool process)
{
    if (process)
        pthread_mutex_unlock(&g_init_mu);
}

td_status td_init_process_group(const td_pg_options *options)
{
    bool process = init_lock();
    if (pg_default_group()) {
        init_unlock(process);
        return error_fmt(TD_ERR_ALREADY, "trying to initialize the default process group twice!");
    }
    td_pg *pg;
    td_status st = td_pg_create(options, &pg);
    if (st == TD_OK) {
        pg_world *w = world_lock();
        w->default_pg = pg;
        if (process)
            pg_set_default_group(pg);
        world_unlock(w);
    }
    init_unlock(process);
    return st;
}

void td_destroy_process_group(void)
{
    bool process = init_lock();
    pg_world *w = world_lock();
    td_pg *def = w->default_pg;
    w->default_pg = NULL;
    if (process)
        pg_set_default_group(NULL);
    td_pg **groups = w->groups.items;
    size_t n = w->groups.len;
    w->groups.items = NULL;
    w->groups.len = w->groups.cap = 0;
    world_unlock(w);
    for (size_t i = n; i-- > 0;)
        pg_destroy_now(groups[i]);
    free(groups);
    if (def)
        pg_destroy_now(def);
    init_unlock(process);
}

void pg_thread_world_begin(void)
{
    if (!pg_thread_world())
        pg_set_thread_world(alloc_zeroed(1, sizeof(pg_world)));
}

void pg_thread_world_end(void)
{
    pg_world *own = pg_thread_world();
    if (!own)
        return;
    td_destroy_process_group(); /* what the thread left: its default group and subgroups */
    pg_set_thread_world(NULL);
    free(own);
}

/* For td_pg_destroy: true when pg is the default group, which was then destroyed with its
 * subgroups; otherwise pg is forgotten by the default group's list (if there) and false. */
static bool claim_destroy(td_pg *pg)
{
    pg_world *w = world_lock();
    if (pg == w->default_pg) {
        world_unlock(w);
        td_destroy_process_group();
        return true;
    }
    for (size_t i = 0; i < w->groups.len; i++) {
        if (w->groups.items[i] == pg) {
            for (size_t j = i + 1; j < w->groups.len; j++)
                w->groups.items[j - 1] = w->groups.items[j];
            w->groups.len--;
            break;
        }
    }
    world_unlock(w);
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
    pg_world *w = world_lock();
    TD_VEC_PUSH(&w->groups, pg);
    world_unlock(w);
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
