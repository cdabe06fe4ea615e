/* Process-group lifecycle (spec/c10d.md C1, C2, C9): the default group and its errors, creating,
 * destroying and re-creating groups, subgroups with rank translation and non-members, several
 * groups used at once, the backend registry, and every argument error of the collectives. */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/thread.h"
#include "pg_util.h"

#define NOT_INIT_MSG "Default process group has not been initialized, please make sure to call init_process_group."

static td_tensor *ones(td_dtype dt, int64_t n)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_ones(dt, TD_SHAPE(n), &t));
    return t;
}

static double sum_of(const td_tensor *t)
{
    double s = 0;
    for (int64_t i = 0; i < td_tensor_numel(t); i++)
        s += pg_test_get(t, i);
    return s;
}

/* ---- the default group ------------------------------------------------------------------------ */

static void default_group_body(td_test_ctx *ctx)
{
    int ws = ctx->world_size;
    TD_CHECK(!td_is_initialized());
    TD_CHECK(td_default_pg() == NULL);
    TD_CHECK_EQ(td_get_rank(), -1);
    TD_CHECK_EQ(td_get_world_size(), -1);
    td_tensor *t = ones(TD_FLOAT32, 4);
    TD_CHECK_ERR(td_pg_all_reduce(NULL, t, TD_OP_SUM, NULL), TD_ERR_NOT_INIT, NOT_INIT_MSG);
    td_pg *sub = NULL;
    TD_CHECK_ERR(td_new_group(NULL, 0, NULL, &sub), TD_ERR_NOT_INIT, NOT_INIT_MSG);

    /* Option errors, all before any rendezvous. */
    td_store *hs = NULL;
    TD_CHECK_OK(td_hash_store_create(&hs));
    td_pg_options o = pg_test_options(ctx, NULL);
    o.store = hs;
    TD_CHECK_ERR(td_init_process_group(&o), TD_ERR_INVALID, "Cannot specify both init_method and store.");
    o.init_method = NULL;
    o.world_size = -1;
    TD_CHECK_ERR(td_init_process_group(&o), TD_ERR_INVALID, "world_size must be positive if using store");
    o.world_size = ws;
    o.rank = -1;
    TD_CHECK_ERR(td_init_process_group(&o), TD_ERR_INVALID, "rank must be non-negative if using store");
    td_store_release(hs);
    o = pg_test_options(ctx, NULL);
    o.backend = "nonesuch";
    TD_CHECK_ERR(td_init_process_group(&o), TD_ERR_INVALID, "Invalid backend: 'nonesuch'");
    o = pg_test_options(ctx, NULL);
    o.debug_level = "verbose";
    TD_CHECK_ERR(td_init_process_group(&o), TD_ERR_INVALID, "The value of TDIST_DEBUG must be OFF, INFO, or DETAIL.");
    o.debug_level = "info";
    o.timeout_ms = -5;
    TD_CHECK_ERR(td_init_process_group(&o), TD_ERR_INVALID, "timeout");
    TD_CHECK(!td_is_initialized());

    o = pg_test_options(ctx, NULL);
    TD_CHECK_OK(td_init_process_group(&o));
    TD_CHECK(td_is_initialized());
    TD_CHECK_EQ(td_get_rank(), ctx->rank);
    TD_CHECK_EQ(td_get_world_size(), ws);
    TD_CHECK_STR_EQ(td_pg_name(NULL), "0");
    TD_CHECK_STR_EQ(td_pg_backend(NULL), pg_test_backend(ctx));
    TD_CHECK_ERR(td_init_process_group(&o), TD_ERR_ALREADY, "trying to initialize the default process group twice!");
    TD_CHECK_OK(td_pg_all_reduce(NULL, t, TD_OP_SUM, NULL));
    TD_CHECK_NEAR(sum_of(t), 4.0 * ws, 0);

    /* Subgroups of the default group are named "1", "2", ...; non-members get a handle of rank -1. */
    TD_CHECK_OK(td_new_group(NULL, 0, NULL, &sub));
    TD_CHECK_STR_EQ(td_pg_name(sub), "1");
    TD_CHECK_EQ(td_pg_size(sub), ws);
    int zero = 0;
    td_pg *only0 = NULL;
    TD_CHECK_OK(td_new_group(&zero, 1, NULL, &only0));
    TD_CHECK_STR_EQ(td_pg_name(only0), "2");
    if (ctx->rank == 0) {
        TD_CHECK_EQ(td_pg_rank(only0), 0);
        TD_CHECK_OK(td_pg_all_reduce(only0, t, TD_OP_SUM, NULL));
    } else {
        TD_CHECK_EQ(td_pg_rank(only0), -1);
        TD_CHECK_EQ(td_pg_size(only0), -1);
        char want[160];
        snprintf(want, sizeof want, "Running all_reduce on global rank %d which does not belong to the given group.",
                 ctx->rank);
        TD_CHECK_ERR(td_pg_all_reduce(only0, t, TD_OP_SUM, NULL), TD_ERR_NOT_MEMBER, want);
    }
    td_pg_destroy(sub); /* one subgroup by hand; only0 goes with the default group */
    td_destroy_process_group();
    TD_CHECK(!td_is_initialized());
    TD_CHECK_EQ(td_get_rank(), -1);
    TD_CHECK_ERR(td_pg_barrier(NULL, NULL), TD_ERR_NOT_INIT, NOT_INIT_MSG);

    /* Re-initialized (now with an explicit store), the names start again at "0". */
    o.init_method = NULL;
    o.store = pg_test_store(ctx);
    TD_CHECK_OK(td_init_process_group(&o));
    td_store_release(o.store);
    TD_CHECK_STR_EQ(td_pg_name(NULL), "0");
    TD_CHECK_OK(td_new_group(NULL, 0, NULL, &sub));
    TD_CHECK_STR_EQ(td_pg_name(sub), "1");
    TD_CHECK_OK(td_pg_all_reduce(sub, t, TD_OP_SUM, NULL));
    td_pg_destroy(td_default_pg()); /* the default group takes its subgroups with it */
    TD_CHECK(!td_is_initialized());
    td_tensor_release(t);
}

TD_TEST(default_group, .world_size = 2, .params = TD_PG_PROCESS_BACKENDS, .static_skip = pg_test_skip_unavailable,
        .setup = pg_test_setup,
        .timeout_s = 60)
{
    default_group_body(ctx);
}

/* The threaded backend with one rank in a process, whose default group is the process's. */
TD_TEST(default_group_single, .world_size = 1, .params = TD_PG_THREAD_BACKENDS, .timeout_s = 60)
{
    default_group_body(ctx);
}

/* In threaded mode each rank thread has its own default group (c10d's ThreadLocalWorld): the same
 * body, ranks as threads. */
TD_TEST(default_group_threaded, .world_size = 3, .threads = true, .params = TD_PG_THREAD_BACKENDS, .timeout_s = 60)
{
    default_group_body(ctx);
}

/* What a thread a rank starts sees: the process's default group (none in threaded mode). */
typedef struct default_seen {
    bool initialized;
    int rank, world_size;
    td_pg *pg;
} default_seen;

static void *see_default(void *arg)
{
    default_seen *seen = arg;
    seen->initialized = td_is_initialized();
    seen->rank = td_get_rank();
    seen->world_size = td_get_world_size();
    seen->pg = td_default_pg();
    return NULL;
}

static default_seen seen_from_new_thread(void)
{
    default_seen seen = {0};
    pthread_t t;
    TD_CHECK(pthread_create(&t, NULL, see_default, &seen) == 0);
    TD_CHECK(pthread_join(t, NULL) == 0);
    return seen;
}

static void *destroy_default(void *arg)
{
    (void)arg;
    td_destroy_process_group();
    return NULL;
}

static td_pg *g_rank_defaults[4]; /* each rank thread's default group, to compare */

/* Every default-group call on four rank threads at once: each has its own group, the collectives
 * with a NULL group run on it, new_group works from it, and a thread the rank starts sees none. */
TD_TEST(default_group_per_rank_thread, .world_size = 4, .threads = true, .params = TD_PG_THREAD_BACKENDS,
        .timeout_s = 60)
{
    int ws = ctx->world_size, rank = ctx->rank;
    TD_CHECK(!td_is_initialized());
    td_pg_options o = pg_test_options(ctx, NULL);
    TD_CHECK_OK(td_init_process_group(&o));
    TD_CHECK(td_is_initialized());
    TD_CHECK_EQ(td_get_rank(), rank);
    TD_CHECK_EQ(td_get_world_size(), ws);
    TD_CHECK_EQ(td_pg_rank(NULL), rank);
    TD_CHECK_STR_EQ(td_pg_backend(NULL), "threaded");
    TD_CHECK_ERR(td_init_process_group(&o), TD_ERR_ALREADY, "trying to initialize the default process group twice!");

    td_tensor *t = ones(TD_FLOAT32, 4);
    TD_CHECK_OK(td_pg_all_reduce(NULL, t, TD_OP_SUM, NULL));
    TD_CHECK_NEAR(sum_of(t), 4.0 * ws, 0);
    td_tensor *b = NULL;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT32, TD_SHAPE(3), (double)(rank + 10), &b));
    TD_CHECK_OK(td_pg_broadcast(NULL, b, 2, NULL));
    TD_CHECK_NEAR(sum_of(b), 3.0 * 12, 0);
    g_rank_defaults[rank] = td_default_pg();
    TD_CHECK_OK(td_pg_barrier(NULL, NULL));
    for (int r = 0; r < ws; r++) /* four groups, one per rank thread */
        TD_CHECK(r == rank || g_rank_defaults[r] != g_rank_defaults[rank]);
    TD_CHECK_OK(td_pg_barrier(NULL, NULL)); /* nobody reads the array after this */

    default_seen seen = seen_from_new_thread();
    TD_CHECK(!seen.initialized);
    TD_CHECK_EQ(seen.rank, -1);
    TD_CHECK_EQ(seen.world_size, -1);
    TD_CHECK(seen.pg == NULL);

    int evens[] = {0, 2};
    td_pg *sub = NULL;
    TD_CHECK_OK(td_new_group(evens, 2, NULL, &sub));
    td_tensor *s = ones(TD_FLOAT32, 2);
    if (rank % 2 == 0) {
        TD_CHECK_EQ(td_pg_rank(sub), rank / 2);
        TD_CHECK_OK(td_pg_all_reduce(sub, s, TD_OP_SUM, NULL));
        TD_CHECK_NEAR(sum_of(s), 4.0, 0);
    } else {
        TD_CHECK_EQ(td_pg_rank(sub), -1);
    }
    TD_CHECK_OK(td_pg_barrier(NULL, NULL));
    td_destroy_process_group(); /* takes sub with it */
    TD_CHECK(!td_is_initialized());
    TD_CHECK_EQ(td_get_rank(), -1);
    TD_CHECK_ERR(td_pg_barrier(NULL, NULL), TD_ERR_NOT_INIT, NOT_INIT_MSG);
    td_tensor_release(t);
    td_tensor_release(b);
    td_tensor_release(s);
}

/* A rank thread that ends without destroying its default group: the harness destroys it when the
 * thread ends (the case's leak check sees no worker thread left). */
TD_TEST(default_group_left_to_the_harness, .world_size = 2, .threads = true, .params = TD_PG_THREAD_BACKENDS,
        .timeout_s = 60)
{
    td_pg_options o = pg_test_options(ctx, NULL);
    TD_CHECK_OK(td_init_process_group(&o));
    td_pg *sub = NULL;
    TD_CHECK_OK(td_new_group(NULL, 0, NULL, &sub));
    TD_CHECK_OK(td_pg_barrier(NULL, NULL));
}

/* A rank thread that fails a check leaves its default group, which the harness destroys as the
 * thread unwinds: the ranks waiting for it in a collective fail instead of hanging. */
TD_TEST(inner_default_group_rank_fails, .world_size = 3, .threads = true, .params = TD_PG_THREAD_BACKENDS,
        .timeout_s = 30, .hidden = true)
{
    td_pg_options o = pg_test_options(ctx, NULL);
    TD_CHECK_OK(td_init_process_group(&o));
    TD_CHECK_OK(td_pg_barrier(NULL, NULL));
    if (ctx->rank == 1)
        TD_FAIL("rank 1 gives up");
    td_tensor *t = ones(TD_FLOAT32, 4);
    td_status st = td_pg_all_reduce(NULL, t, TD_OP_SUM, NULL);
    td_tensor_release(t);
    TD_CHECK(st != TD_OK);
    td_destroy_process_group();
}

TD_TEST(default_group_rank_thread_fails, .timeout_s = 60, .static_skip = pg_test_skip_unavailable,
        .params = TD_PG_THREAD_BACKENDS)
{
    td_test_result r;
    TD_CHECK_OK(td_test_run("inner_default_group_rank_fails/threaded", &r));
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK_CONTAINS(r.message, "Thread 1 exited with exception:\n");
    TD_CHECK_CONTAINS(r.message, "rank 1 gives up");
    TD_CHECK(strstr(r.message, "Thread 0") == NULL); /* the others' collectives failed, as they expected */
    TD_CHECK(strstr(r.message, "Thread 2") == NULL);
    td_test_result_free(&r);
}

/* An ordinary process keeps the process-wide default group: a thread the body starts sees the
 * group the main thread made, and can destroy it. */
TD_TEST(default_group_process_wide, .world_size = 2, .params = "tcp", .timeout_s = 60)
{
    td_pg_options o = pg_test_options(ctx, NULL);
    TD_CHECK_OK(td_init_process_group(&o));
    default_seen seen = seen_from_new_thread();
    TD_CHECK(seen.initialized);
    TD_CHECK_EQ(seen.rank, ctx->rank);
    TD_CHECK_EQ(seen.world_size, ctx->world_size);
    TD_CHECK(seen.pg == td_default_pg());
    TD_CHECK_OK(td_pg_barrier(NULL, NULL));
    pthread_t t;
    TD_CHECK(pthread_create(&t, NULL, destroy_default, NULL) == 0);
    TD_CHECK(pthread_join(t, NULL) == 0);
    TD_CHECK(!td_is_initialized());
}

/* The threaded backend needs its ranks in one process: ranks in two processes get a clear error
 * (rank 1) or time out waiting for the other to join (rank 0), instead of hanging. */
TD_TEST(threaded_ranks_in_two_processes, .world_size = 2, .params = TD_PG_THREAD_BACKENDS, .timeout_s = 60)
{
    pg_test_opts o = {.timeout_ms = 2000};
    td_pg_options po = pg_test_options(ctx, &o);
    po.init_method = NULL;
    po.store = pg_test_store(ctx);
    td_pg *pg = NULL;
    td_status st = td_pg_create(&po, &pg);
    if (ctx->rank == 0)
        TD_CHECK_ERR(st, TD_ERR_TIMEOUT, "waiting for all 2 ranks to join (1 joined)");
    else
        TD_CHECK_ERR(st, TD_ERR_INVALID, "The threaded backend runs all ranks as threads of one process");
    TD_CHECK(pg == NULL);
    /* Rank 0 serves the store: it goes last. */
    if (ctx->rank == 1)
        TD_CHECK_OK(td_store_set_str(po.store, "rank1_done", "1"));
    else
        TD_CHECK_OK(td_store_wait(po.store, (const char *[]){"rank1_done"}, 1, 30000));
    td_store_release(po.store);
}

/* ---- explicit groups ------------------------------------------------------------------------- */

/* Whether this process has a thread named `name` and every such thread has `slice_us`. */
static bool named_threads_have_slice(const char *name, int64_t slice_us)
{
    int found = 0, matched = 0;
    DIR *d = opendir("/proc/self/task");
    TD_CHECK(d != NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        pid_t tid = (pid_t)atoi(e->d_name);
        char comm[32];
        if (tid <= 0 || !thread_name_of(tid, comm, sizeof comm) || strcmp(comm, name) != 0)
            continue; /* ".", "..", another thread, or one that ended meanwhile */
        found++;
        matched += thread_slice(tid) == slice_us;
    }
    closedir(d);
    return found > 0 && matched == found;
}

/* The worker names itself and asks for its slice as it starts: wait for both. */
static bool wait_worker_slice(const char *name, int64_t slice_us)
{
    int64_t deadline = deadline_after_ms(20000);
    while (!named_threads_have_slice(name, slice_us)) {
        if (deadline_passed(deadline))
            return false;
        clock_sleep_ms(1);
    }
    return true;
}

/* A group's worker runs collectives while the application computes: it asks for a short scheduler
 * slice (100 us) so that its wake-ups do not wait out the compute thread's slice; TDIST_WORKER_SLICE_US
 * sets it and 0 leaves the kernel's default. Ranks as processes: the case sets the environment. */
TD_TEST(worker_asks_for_a_short_slice, .world_size = 2, .params = "tcp", .static_skip = pg_test_skip_unavailable,
        .timeout_s = 60)
{
    int64_t base = thread_slice(0);
    if (base <= 0 || !thread_request_slice(base == 300 ? 400 : 300) || thread_slice(0) == base)
        TD_SKIP(TD_SKIP_GENERIC, "this kernel has no per-thread scheduler slice (EEVDF custom slices: Linux 6.12)");
    int64_t mine = thread_slice(0);
    td_pg *pg = pg_test_init(ctx, NULL);
    TD_CHECK(wait_worker_slice("td-pg-0", 100));
    TD_CHECK_EQ(thread_slice(0), mine); /* the creating thread keeps its own */

    TD_CHECK_EQ(setenv("TDIST_WORKER_SLICE_US", "0", 1), 0);
    pg_test_opts o2 = {.init_url = pg_test_url(ctx, "other"), .group_name = "nodefault"};
    td_pg *pg2 = pg_test_init(ctx, &o2);
    TD_CHECK(wait_worker_slice("td-pg-nodefault", mine)); /* inherited from its creator */
    TD_CHECK_EQ(unsetenv("TDIST_WORKER_SLICE_US"), 0);
    pg_test_done(ctx, pg2);
    pg_test_done(ctx, pg);
}

TD_PG_TEST(lifecycle, 3, .timeout_s = 60)
{
    int ws = ctx->world_size;
    td_pg *pg = pg_test_init(ctx, NULL);
    TD_CHECK_STR_EQ(td_pg_name(pg), "0");
    TD_CHECK_STR_EQ(td_pg_backend(pg), pg_test_backend(ctx));
    TD_CHECK_EQ(td_pg_timeout_ms(pg), 60000);
    int n = 0;
    const int *ranks = td_pg_ranks(pg, &n);
    TD_CHECK_EQ(n, ws);
    for (int i = 0; i < n; i++)
        TD_CHECK_EQ(ranks[i], i);
    int r = -1;
    TD_CHECK_OK(td_pg_global_rank(pg, 2, &r));
    TD_CHECK_EQ(r, 2);
    TD_CHECK_ERR(td_pg_global_rank(pg, 5, &r), TD_ERR_INVALID, "Group rank 5 is not part of group 0");
    TD_CHECK_ERR(td_pg_group_rank(pg, 7, &r), TD_ERR_INVALID, "Global rank 7 is not part of group 0");

    /* Capability queries. */
    TD_CHECK_OK(td_pg_supports(pg, "all_reduce", TD_FLOAT32, TD_SUM));
    TD_CHECK_OK(td_pg_supports(pg, "send", TD_COMPLEX128, TD_SUM));
    TD_CHECK_ERR(td_pg_supports(pg, "all_reduce", TD_COMPLEX64, TD_PRODUCT), TD_ERR_UNSUPPORTED,
                 "all_reduce does not support PRODUCT on complex tensors");
    TD_CHECK_ERR(td_pg_supports(pg, "reduce_scatter", TD_FLOAT32, TD_BXOR), TD_ERR_UNSUPPORTED, "BXOR");
    TD_CHECK_ERR(td_pg_supports(pg, "all_reduce", TD_INT32, TD_AVG), TD_ERR_UNSUPPORTED, "AVG");
    TD_CHECK_ERR(td_pg_supports(pg, "frobnicate", TD_FLOAT32, TD_SUM), TD_ERR_INVALID, "unknown collective");

    /* The registry. */
    TD_CHECK(td_backend_available("threaded"));
    TD_CHECK(!td_backend_available("nonesuch"));
    TD_CHECK_ERR(td_register_backend(NULL), TD_ERR_INVALID, NULL);

    /* A second root group beside the first (its own rendezvous, through a URL), both used at once. */
    pg_test_opts o2 = {.init_url = pg_test_url(ctx, "other"), .group_name = "other"};
    td_pg *pg2 = pg_test_init(ctx, &o2);
    TD_CHECK_STR_EQ(td_pg_name(pg2), "other");
    td_tensor *a = ones(TD_INT64, 10), *b = ones(TD_INT64, 20);
    td_future *fa = NULL, *fb = NULL;
    TD_CHECK_OK(td_pg_all_reduce(pg, a, TD_OP_SUM, &fa));
    TD_CHECK_OK(td_pg_all_reduce(pg2, b, TD_OP_SUM, &fb));
    TD_CHECK_OK(td_future_wait(fb, 0));
    TD_CHECK_OK(td_future_wait(fa, 0));
    TD_CHECK_NEAR(sum_of(a), 10.0 * ws, 0);
    TD_CHECK_NEAR(sum_of(b), 20.0 * ws, 0);
    td_future_release(fa);
    td_future_release(fb);

    /* Destroy and re-create in the same process. */
    pg_test_done(ctx, pg);
    pg = pg_test_init(ctx, NULL);
    TD_CHECK_OK(td_pg_all_reduce(pg, a, TD_OP_MAX, NULL));
    TD_CHECK_NEAR(sum_of(a), 10.0 * ws, 0);
    pg_test_done(ctx, pg);
    pg_test_done(ctx, pg2);
    td_tensor_release(a);
    td_tensor_release(b);
}

/* ---- subgroups --------------------------------------------------------------------------------- */

static void subgroups_body(td_test_ctx *ctx)
{
    int ws = ctx->world_size, me = ctx->rank;
    td_pg *world = pg_test_init(ctx, NULL);
    td_pg *g = NULL;
    int bad[] = {0, ws + 4};
    TD_CHECK_ERR(td_pg_new_group(world, bad, 2, NULL, &g), TD_ERR_INVALID,
                 "The new group's rank should be within the world_size set by init_process_group");
    int *many = calloc((size_t)ws + 1, sizeof(int));
    TD_CHECK_ERR(td_pg_new_group(world, many, ws + 1, NULL, &g), TD_ERR_INVALID,
                 "the new group's world size should be less or equal to the world size set by init_process_group");
    free(many);
    int dup[] = {1, 1};
    TD_CHECK_ERR(td_pg_new_group(world, dup, 2, NULL, &g), TD_ERR_INVALID, "appears more than once");

    /* {2, 1}: sorted, so global rank 1 is group rank 0. */
    int mid[] = {2, 1};
    TD_CHECK_OK(td_pg_new_group(world, mid, 2, NULL, &g));
    TD_CHECK_STR_EQ(td_pg_name(g), "1");
    int n = 0;
    const int *ranks = td_pg_ranks(g, &n);
    TD_CHECK(n == 2 && ranks[0] == 1 && ranks[1] == 2);
    td_tensor *t = ones(TD_FLOAT64, 6);
    TD_CHECK_OK(td_tensor_fill(t, me));
    bool member = me == 1 || me == 2;
    if (member) {
        TD_CHECK_EQ(td_pg_rank(g), me - 1);
        TD_CHECK_EQ(td_pg_size(g), 2);
        int r;
        TD_CHECK_OK(td_pg_global_rank(g, 1, &r));
        TD_CHECK_EQ(r, 2);
        TD_CHECK_OK(td_pg_group_rank(g, 1, &r));
        TD_CHECK_EQ(r, 0);
        TD_CHECK_ERR(td_pg_group_rank(g, 0, &r), TD_ERR_INVALID, "Global rank 0 is not part of group 1");
        TD_CHECK_OK(td_pg_all_reduce(g, t, TD_OP_SUM, NULL));
        TD_CHECK_NEAR(sum_of(t), 6 * 3.0, 0);
        TD_CHECK_OK(td_tensor_fill(t, me));
        TD_CHECK_OK(td_pg_broadcast(g, t, 1, NULL)); /* group rank 1 is global rank 2 */
        TD_CHECK_NEAR(sum_of(t), 6 * 2.0, 0);
    } else {
        TD_CHECK_EQ(td_pg_rank(g), -1);
        TD_CHECK_EQ(td_pg_size(g), -1);
        char want[160];
        snprintf(want, sizeof want, "Running broadcast on global rank %d which does not belong to the given group.", me);
        TD_CHECK_ERR(td_pg_broadcast(g, t, 0, NULL), TD_ERR_NOT_MEMBER, want);
        TD_CHECK_ERR(td_pg_barrier(g, NULL), TD_ERR_NOT_MEMBER, NULL);
        TD_CHECK_NEAR(sum_of(t), 6.0 * me, 0);
    }

    /* Two disjoint groups used at once, beside the world group. */
    int lo[] = {0, 1}, hi[] = {2, 3};
    td_pg *glo = NULL, *ghi = NULL;
    TD_CHECK_OK(td_pg_new_group(world, lo, 2, NULL, &glo));
    TD_CHECK_OK(td_pg_new_group(world, hi, ws >= 4 ? 2 : 1, NULL, &ghi));
    TD_CHECK_STR_EQ(td_pg_name(glo), "2");
    TD_CHECK_STR_EQ(td_pg_name(ghi), "3");
    td_pg *mine = me < 2 ? glo : ghi;
    td_tensor *a = ones(TD_INT32, 8), *b = ones(TD_INT32, 8);
    td_future *fa = NULL, *fb = NULL;
    TD_CHECK_OK(td_pg_all_reduce(mine, a, TD_OP_SUM, &fa));
    TD_CHECK_OK(td_pg_all_reduce(world, b, TD_OP_SUM, &fb));
    TD_CHECK_OK(td_future_wait(fa, 0));
    TD_CHECK_OK(td_future_wait(fb, 0));
    TD_CHECK_NEAR(sum_of(a), 8.0 * td_pg_size(mine), 0);
    TD_CHECK_NEAR(sum_of(b), 8.0 * ws, 0);
    td_future_release(fa);
    td_future_release(fb);

    /* A subgroup of a subgroup: named within its parent, ranks translated to the root's. */
    if (me < 2) {
        int one = 1;
        td_pg *nested = NULL;
        TD_CHECK_OK(td_pg_new_group(glo, &one, 1, NULL, &nested));
        TD_CHECK_STR_EQ(td_pg_name(nested), "2.1");
        int r = -1;
        TD_CHECK_OK(td_pg_global_rank(nested, 0, &r));
        TD_CHECK_EQ(r, 1);
        TD_CHECK_EQ(td_pg_rank(nested), me == 1 ? 0 : -1);
        td_pg_destroy(nested);
    }

    /* Subgroups outlive their parent. (The barrier first: rank 0 serves the store, which the
     * others need until their subgroups exist.) */
    TD_CHECK_OK(td_pg_barrier(world, NULL));
    td_pg_destroy(world);
    if (member) {
        TD_CHECK_OK(td_pg_all_reduce(g, b, TD_OP_SUM, NULL));
        TD_CHECK_NEAR(sum_of(b), 16.0 * ws, 0);
    }
    td_pg_destroy(g);
    td_pg_destroy(glo);
    pg_test_done(ctx, ghi);
    td_tensor_release(t);
    td_tensor_release(a);
    td_tensor_release(b);
}

TD_PG_TEST(subgroups_3, 3, .timeout_s = 60) { subgroups_body(ctx); }
TD_PG_TEST(subgroups_4, 4, .timeout_s = 60) { subgroups_body(ctx); }

/* ---- argument errors ---------------------------------------------------------------------------- */

TD_PG_TEST(argument_errors, 2, .timeout_s = 60)
{
    int me = ctx->rank;
    td_pg *pg = pg_test_init(ctx, NULL);
    td_tensor *f4 = ones(TD_FLOAT32, 4), *f3 = ones(TD_FLOAT32, 3), *i4 = ones(TD_INT32, 4), *f8 = ones(TD_FLOAT32, 8);
    td_tensor *c4 = ones(TD_COMPLEX64, 4), *f5 = ones(TD_FLOAT32, 5);

    TD_CHECK_ERR(td_pg_all_reduce(pg, NULL, TD_OP_SUM, NULL), TD_ERR_INVALID,
                 "Invalid function argument. Expected parameter `tensor` of type td_tensor but got NULL instead.");
    TD_CHECK_ERR(td_pg_all_reduce(pg, c4, TD_OP_PRODUCT, NULL), TD_ERR_INVALID,
                 "all_reduce does not support PRODUCT on complex tensors");
    TD_CHECK_ERR(td_pg_all_reduce(pg, c4, TD_OP_MAX, NULL), TD_ERR_INVALID,
                 "all_reduce does not support MAX on complex tensors");
    TD_CHECK_ERR(td_pg_reduce(pg, c4, 0, TD_OP_BAND, NULL), TD_ERR_INVALID, "reduce does not support BAND on complex");
    TD_CHECK_ERR(td_pg_all_reduce(pg, f4, TD_OP_BXOR, NULL), TD_ERR_INVALID, "all_reduce: reduce op BXOR");
    TD_CHECK_ERR(td_pg_all_reduce(pg, i4, TD_OP_AVG, NULL), TD_ERR_INVALID, "all_reduce: reduce op AVG");
    TD_CHECK_ERR(td_pg_all_reduce(pg, f4, td_op_of((td_reduce_op)42), NULL), TD_ERR_INVALID, "invalid reduce op");

    TD_CHECK_ERR(td_pg_broadcast(pg, f4, 2, NULL), TD_ERR_INVALID, "broadcast: invalid root rank: 2");
    TD_CHECK_ERR(td_pg_broadcast(pg, f4, -1, NULL), TD_ERR_INVALID, "broadcast: invalid root rank: -1");
    TD_CHECK_ERR(td_pg_reduce(pg, f4, 7, TD_OP_SUM, NULL), TD_ERR_INVALID, "reduce: invalid root rank: 7");

    td_tensor *mixed[2] = {f4, i4}, *short_list[2] = {f4, f3}, *f4s[2] = {f4, f4};
    TD_CHECK_ERR(td_pg_all_gather(pg, mixed, f4, NULL), TD_ERR_INVALID,
                 "Invalid usage of tensors with different dtypes Found float32 and  int32");
    TD_CHECK_ERR(td_pg_all_gather(pg, short_list, f4, NULL), TD_ERR_INVALID,
                 "all_gather: invalid tensor size in `tensor_list` at index 1 (expected 4 elements, got 3)");
    TD_CHECK_ERR(td_pg_all_gather(pg, NULL, f4, NULL), TD_ERR_INVALID, "Expected parameter `tensor_list`");
    TD_CHECK_ERR(td_pg_all_gather_into_tensor(pg, f4, f4, NULL), TD_ERR_INVALID,
                 "output tensor size must be equal to world_size times input tensor size");
    TD_CHECK_ERR(td_pg_all_gather_into_tensor(pg, f8, i4, NULL), TD_ERR_INVALID,
                 "Invalid usage of tensors with different dtypes");
    TD_CHECK_ERR(td_pg_reduce_scatter_tensor(pg, f4, f5, TD_OP_SUM, NULL), TD_ERR_INVALID,
                 "input tensor must be the same size as output size times world size");
    TD_CHECK_ERR(td_pg_reduce_scatter(pg, f3, f4s, TD_OP_SUM, NULL), TD_ERR_INVALID,
                 "reduce_scatter: invalid tensor size in `input_list` at index 0 (expected 3 elements, got 4)");
    TD_CHECK_ERR(td_pg_all_reduce_coalesced(pg, mixed, 2, TD_OP_SUM, NULL), TD_ERR_INVALID,
                 "Invalid usage of tensors with different dtypes Found float32 and  int32");
    TD_CHECK_ERR(td_pg_all_reduce_coalesced(pg, f4s, 0, TD_OP_SUM, NULL), TD_ERR_INVALID, "non-empty");
    td_tensor *four_out[4] = {f4, f4, f4, f4};
    TD_CHECK_ERR(td_pg_all_gather_coalesced(pg, four_out, mixed, 2, NULL), TD_ERR_INVALID,
                 "Invalid usage of tensors with different dtypes");

    if (me == 0) {
        TD_CHECK_ERR(td_pg_gather(pg, NULL, f4, 0, NULL), TD_ERR_INVALID,
                     "Argument ``gather_list`` must be specified on destination rank.");
        TD_CHECK_ERR(td_pg_scatter(pg, f4, NULL, 0, NULL), TD_ERR_INVALID,
                     "Argument ``scatter_list`` must be specified on source rank.");
    } else {
        TD_CHECK_ERR(td_pg_gather(pg, f4s, f4, 0, NULL), TD_ERR_INVALID,
                     "Argument ``gather_list`` must NOT be specified on non-destination ranks.");
        TD_CHECK_ERR(td_pg_scatter(pg, f4, f4s, 0, NULL), TD_ERR_INVALID,
                     "Argument ``scatter_list`` must NOT be specified on non-source ranks.");
    }
    if (me == 1)
        TD_CHECK_ERR(td_pg_gather(pg, short_list, f4, 1, NULL), TD_ERR_INVALID,
                     "gather: invalid tensor size in `gather_list` at index 1 (expected 4 elements, got 3)");

    td_tensor *odd = NULL;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(5, 2), &odd));
    TD_CHECK_ERR(td_pg_all_to_all_single(pg, odd, odd, NULL, NULL, NULL), TD_ERR_INVALID,
                 "Tensor's dim 0 does not divide equally across group size");
    int64_t splits[2] = {1, 3};
    TD_CHECK_ERR(td_pg_all_to_all_single(pg, odd, odd, splits, splits, NULL), TD_ERR_INVALID,
                 "Split sizes doesn't match total dim 0 size");
    td_tensor *scalar = NULL;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE_SCALAR, &scalar));
    TD_CHECK_ERR(td_pg_all_to_all_single(pg, scalar, scalar, NULL, NULL, NULL), TD_ERR_INVALID,
                 "at least one dimension");
    TD_CHECK_ERR(td_pg_all_to_all(pg, mixed, f4s, NULL), TD_ERR_INVALID, "Invalid usage of tensors with different dtypes");

    TD_CHECK_ERR(td_pg_send(pg, f4, me, 0, NULL), TD_ERR_INVALID,
                 "Invalid destination rank: destination rank should not be the same as the rank of the current "
                 "process.");
    TD_CHECK_ERR(td_pg_recv(pg, f4, me, 0, NULL, NULL), TD_ERR_INVALID,
                 "Invalid source rank: source rank should not be the same as the rank of the current process.");
    TD_CHECK_ERR(td_pg_send(pg, f4, 5, 0, NULL), TD_ERR_INVALID, "send: invalid destination rank: 5");
    TD_CHECK_ERR(td_pg_recv(pg, f4, -3, 0, NULL, NULL), TD_ERR_INVALID, "recv: invalid source rank: -3");
    TD_CHECK_ERR(td_pg_send(pg, f4, 1 - me, -1, NULL), TD_ERR_INVALID, "tag must be non-negative");
    /* A batch with one bad op posts nothing. */
    td_p2p_op ops[2] = {{true, f4, 1 - me, 0}, {false, f3, me, 0}};
    td_future *works[2] = {NULL, NULL};
    TD_CHECK_ERR(td_pg_batch_isend_irecv(pg, ops, 2, works), TD_ERR_INVALID, "batch_isend_irecv: op 1");
    TD_CHECK(works[0] == NULL && works[1] == NULL);
    TD_CHECK_ERR(td_pg_batch_isend_irecv(pg, ops, 0, works), TD_ERR_INVALID, "p2p_op_list");

    td_value *v = td_value_int(1), *out = NULL;
    TD_CHECK_ERR(td_pg_gather_object(pg, v, me == 0 ? NULL : &out, 0), TD_ERR_INVALID,
                 me == 0 ? "Argument ``gather_list`` must be specified on destination rank."
                         : "Argument ``gather_list`` must NOT be specified on non-destination ranks.");
    TD_CHECK_ERR(td_pg_scatter_object_list(pg, NULL, v, 0), TD_ERR_INVALID,
                 "Expected argument scatter_object_output_list to be a list of size at least 1.");
    TD_CHECK_ERR(td_pg_broadcast_object_list(pg, v, 0), TD_ERR_INVALID, "must be a td_value list");
    TD_CHECK_ERR(td_pg_all_gather_object(pg, NULL, &out), TD_ERR_INVALID, "NULL");
    TD_CHECK_ERR(td_pg_monitored_barrier(pg, -1, false), TD_ERR_INVALID, "timeout");
    td_value_release(v);

    /* None of that sent anything or failed the group: the next collectives match up. */
    TD_CHECK_OK(td_pg_all_reduce(pg, f4, TD_OP_SUM, NULL));
    TD_CHECK_NEAR(sum_of(f4), 8, 0);
    td_tensor *r3 = NULL; /* not f3, which is being sent meanwhile */
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(3), &r3));
    TD_CHECK_OK(td_pg_send(pg, f3, 1 - me, 0, &works[0]));
    TD_CHECK_OK(td_pg_recv(pg, r3, 1 - me, 0, NULL, &works[1]));
    TD_CHECK_OK(td_future_wait_all(works, 2, 0));
    TD_CHECK_NEAR(sum_of(r3), 3, 0);
    td_future_release(works[0]);
    td_future_release(works[1]);
    td_tensor *all[] = {f4, f3, i4, f8, c4, f5, odd, scalar, r3};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_tensor_release(all[i]);
    pg_test_done(ctx, pg);
}

/* ---- profiling events ------------------------------------------------------------------------- */

typedef struct trace_log {
    pthread_mutex_t mu;
    int n;
    struct {
        char name[48];
        bool is_async;
        int ndim;
        int64_t shape0;
        td_status status;
        bool ordered;
    } ev[32];
} trace_log;

static void on_trace(const td_pg_trace_event *e, void *arg)
{
    trace_log *l = arg;
    pthread_mutex_lock(&l->mu);
    if (l->n < 32) {
        snprintf(l->ev[l->n].name, sizeof l->ev[0].name, "%s", e->name);
        l->ev[l->n].is_async = e->is_async;
        l->ev[l->n].ndim = e->ndim;
        l->ev[l->n].shape0 = e->ndim > 0 ? e->shape[0] : -1;
        l->ev[l->n].status = e->status;
        l->ev[l->n].ordered = e->end_ns >= e->begin_ns && e->begin_ns > 0;
        l->n++;
    }
    pthread_mutex_unlock(&l->mu);
}

static int count_events(trace_log *l, const char *backend, const char *op, bool is_async)
{
    char name[64];
    snprintf(name, sizeof name, "%s:%s", backend, op);
    int n = 0;
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->ev[i].name, name) == 0 && l->ev[i].is_async == is_async && l->ev[i].status == TD_OK &&
            l->ev[i].ordered)
            n++;
    pthread_mutex_unlock(&l->mu);
    return n;
}

TD_PG_TEST(trace_events, 2, .timeout_s = 60)
{
    int me = ctx->rank;
    pg_test_opts o = {.debug_level = "DETAIL"}; /* its extra checks must not show up as events */
    td_pg *pg = pg_test_init(ctx, &o);
    trace_log log = {.mu = PTHREAD_MUTEX_INITIALIZER};
    td_pg_set_trace_callback(pg, on_trace, &log);
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(10, 10, 10), &t));
    td_future *w[3];
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_SUM, &w[0]));
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_SUM, &w[1]));
    TD_CHECK_OK(td_future_wait_all(w, 2, 0));
    TD_CHECK_OK(td_pg_broadcast(pg, t, 1, NULL));
    td_tensor *r = NULL; /* not t, which is being sent meanwhile */
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(10, 10, 10), &r));
    TD_CHECK_OK(td_pg_send(pg, t, 1 - me, 0, &w[2]));
    TD_CHECK_OK(td_pg_recv(pg, r, TD_ANY_SOURCE, 0, NULL, NULL));
    td_tensor_release(r);
    TD_CHECK_OK(td_future_wait(w[2], 0));
    TD_CHECK_OK(td_pg_barrier(pg, NULL));
    for (int i = 0; i < 3; i++)
        td_future_release(w[i]);
    for (int i = 0; i < 5000; i++) { /* the events arrive on the callback thread */
        pthread_mutex_lock(&log.mu);
        int n = log.n;
        pthread_mutex_unlock(&log.mu);
        if (n >= 6)
            break;
        struct timespec d = {0, 2000000};
        nanosleep(&d, NULL);
    }
    td_pg_set_trace_callback(pg, NULL, NULL);
    const char *b = pg_test_backend(ctx);
    TD_CHECK_EQ(count_events(&log, b, "all_reduce", true), 2);
    TD_CHECK_EQ(count_events(&log, b, "broadcast", false), 1);
    TD_CHECK_EQ(count_events(&log, b, "send", true), 1);
    TD_CHECK_EQ(count_events(&log, b, "recvAnySource", false), 1);
    TD_CHECK_EQ(count_events(&log, b, "barrier", false), 1);
    TD_CHECK_EQ(log.n, 6);
    TD_CHECK(log.ev[0].ndim == 3 && log.ev[0].shape0 == 10);
    td_tensor_release(t);
    pg_test_done(ctx, pg);
}

/* A rank that starts late: while rank 0 waits for it at the transports' rendezvous it warns every
 * TDIST_RDZV_PROGRESS naming the rank that is missing (issue 22), then the group forms. */
TD_TEST(rendezvous_names_missing_ranks, .world_size = 2, .params = "tcp,shm", .static_skip = pg_test_skip_unavailable,
        .setup = pg_test_setup, .timeout_s = 60)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.err", ctx->tmpdir, ctx->rank);
    int saved = -1;
    if (ctx->rank == 1) {
        struct timespec d = {1, 500000000}; /* 1.5 s late */
        nanosleep(&d, NULL);
    } else {
        TD_CHECK(setenv("TDIST_RDZV_PROGRESS", "0.2", 1) == 0);
        fflush(stderr);
        saved = dup(2);
        FILE *f = fopen(path, "w");
        TD_CHECK(f != NULL && saved >= 0);
        dup2(fileno(f), 2);
        fclose(f);
    }
    pg_test_opts po = {.init_url = pg_test_url(ctx, "late")}; /* a file store: nothing waits before the transports */
    td_pg *pg = pg_test_init(ctx, &po);
    if (ctx->rank == 0) {
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        unsetenv("TDIST_RDZV_PROGRESS");
        FILE *f = fopen(path, "r");
        char text[8192] = "";
        size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
        text[n] = '\0';
        if (f)
            fclose(f);
        unlink(path);
        TD_CHECK_CONTAINS(text, "rank 0: waiting for 1 of 2 ranks to publish their");
        TD_CHECK_CONTAINS(text, "address (1), ");
    }
    TD_CHECK_OK(td_pg_barrier(pg, NULL));
    pg_test_done(ctx, pg);
}

TD_TEST_MAIN()
