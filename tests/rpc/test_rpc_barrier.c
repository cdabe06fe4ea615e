/* td_rpc_barrier and td_rpc_all_gather among workers, as rpc_test.py's _test_barrier_helper uses
 * them (spec/rpc_part1.md C15): every member resets a counter on the leader (the smallest name),
 * meets the others, increments the counter, meets them again, and then the leader's counter equals
 * the number of members. Over all four workers, over two concurrent disjoint groups, over a group
 * beside workers that meet alone, and from three threads per worker at once (where only the
 * absence of a hang and of a mix-up counts). Then _wait_all_workers twice in a row. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/rpc.h>
#include <tdist/testing.h>

#include "rpc_util.h"

static _Atomic int64_t g_count; /* the leader's counter */

static td_status fn_reset_count(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    (void)result;
    atomic_store(&g_count, 0);
    return TD_OK;
}

static td_status fn_increment_count(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    (void)result;
    atomic_fetch_add(&g_count, 1);
    return TD_OK;
}

static void rpc_up(td_test_ctx *ctx)
{
    const rpc_test_function fns[] = {{"reset_count", fn_reset_count, NULL, NULL},
                                     {"increment_count", fn_increment_count, NULL, NULL}};
    rpc_test_register(fns, sizeof fns / sizeof fns[0]);
    rpc_test_init(ctx, NULL);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* _test_barrier_helper: names are the members; the leader is the smallest. check: single-threaded. */
static void barrier_helper(const char **names, size_t n, const char *me, bool check)
{
    qsort(names, n, sizeof *names, cmp_str);
    const char *leader = names[0];
    td_value *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_name(leader), "reset_count", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    if (check && strcmp(me, leader) == 0)
        TD_CHECK_EQ(atomic_load(&g_count), 0);
    TD_CHECK_OK(td_rpc_barrier(NULL, names, n, TD_RPC_DEFAULT_TIMEOUT));
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_name(leader), "increment_count", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    TD_CHECK_OK(td_rpc_barrier(NULL, names, n, TD_RPC_DEFAULT_TIMEOUT));
    if (check && strcmp(me, leader) == 0)
        TD_CHECK_EQ(atomic_load(&g_count), (int64_t)n);
}

static const char *all_names[] = {"worker0", "worker1", "worker2", "worker3"};

TD_TEST(rpc_barrier_all, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    const char *names[4];
    memcpy(names, all_names, sizeof names);
    barrier_helper(names, 4, all_names[ctx->rank], true);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* Odd and even ids as two groups meeting at the same time. */
TD_TEST(rpc_barrier_subset, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    const char *odd[] = {"worker3", "worker1"}, *even[] = {"worker2", "worker0"};
    barrier_helper(ctx->rank % 2 ? odd : even, 2, all_names[ctx->rank], true);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* Odd ids as a group while each even worker meets alone. */
TD_TEST(rpc_barrier_partial_subset, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    const char *odd[] = {"worker1", "worker3"}, *alone[] = {all_names[ctx->rank]};
    if (ctx->rank % 2)
        barrier_helper(odd, 2, all_names[ctx->rank], true);
    else
        barrier_helper(alone, 1, all_names[ctx->rank], true);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

typedef struct helper_thread {
    pthread_t thread;
    td_status status;
    char error[512];
} helper_thread;

/* One thread's run of the helper over every name, without the counter checks (three threads
 * share the counter). Checks inside a thread would end the rank from the wrong thread, so the
 * thread records its first failure for the main thread. */
static void *barrier_thread(void *p)
{
    helper_thread *h = p;
    const char *names[4];
    memcpy(names, all_names, sizeof names);
    td_value *r = NULL;
    const char *steps[] = {"reset_count", NULL, "increment_count", NULL};
    h->status = TD_OK;
    for (int s = 0; s < 4 && h->status == TD_OK; s++) {
        h->status = steps[s] ? td_rpc_sync(NULL, td_rpc_to_name("worker0"), steps[s], NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &r)
                             : td_rpc_barrier(NULL, names, 4, TD_RPC_DEFAULT_TIMEOUT);
        if (h->status != TD_OK)
            snprintf(h->error, sizeof h->error, "%s", td_last_error());
    }
    return NULL;
}

TD_TEST(rpc_barrier_multithreaded, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    helper_thread threads[3];
    for (int i = 0; i < 3; i++)
        TD_CHECK(pthread_create(&threads[i].thread, NULL, barrier_thread, &threads[i]) == 0);
    for (int i = 0; i < 3; i++) {
        pthread_join(threads[i].thread, NULL);
        TD_CHECK_MSG(threads[i].status == TD_OK, "thread %d: %s", i, threads[i].error);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* _wait_all_workers twice in a row, then a non-graceful shutdown: nothing is in flight after the
 * second round, so no peer is left waiting on this worker. */
TD_TEST(wait_all_workers_twice, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    for (int round = 0; round < 2; round++) {
        td_value *g = NULL;
        TD_CHECK_OK(td_rpc_all_gather(NULL, NULL, NULL, 0, TD_RPC_DEFAULT_TIMEOUT, &g));
        TD_CHECK_EQ(td_value_len(g), 4);
        td_value_release(g);
    }
    TD_CHECK_OK(td_rpc_shutdown(false, 0));
}

TD_TEST_MAIN()
