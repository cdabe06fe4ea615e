/* The auto backend (src/backends/auto.c) with hosts simulated through TDIST_HOST_ID: what it makes
 * of a group (shm on one host, tcp with one rank per host, hierarchical otherwise, with the
 * traffic between simulated hosts really on TCP sockets and within a host on UNIX sockets and
 * shared memory), every collective and any-source receives when the hosts' ranks interleave and
 * the roots are not leaders, and a leader or a non-leader killed mid all_reduce failing every
 * survivor on both hosts within 2 s, naming it, with nothing left in /dev/shm. (The whole
 * process-group suite also runs on "auto2x2": tests/pg.) */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../pg/pg_util.h"
#include "../support/transport_util.h"
#include "backends/auto.h"
#include "base/clock.h"
#include "pg/pg_impl.h"
#include "transport/tcp.h"

/* Each rank is a fresh process with no thread of the library yet: setting the variable is safe. */
static void set_host(int host)
{
    char v[32];
    snprintf(v, sizeof v, "auto-test-host-%d", host);
    setenv("TDIST_HOST_ID", v, 1);
}

static td_pg *make_group(td_test_ctx *ctx)
{
    td_store *store = pg_test_store(ctx);
    td_pg_options o = TD_PG_OPTIONS_INIT;
    o.backend = "auto";
    o.store = store;
    o.rank = ctx->rank;
    o.world_size = ctx->world_size;
    o.timeout_ms = 60000;
    td_pg *pg = NULL;
    TD_CHECK_OK(td_pg_create(&o, &pg));
    td_store_release(store);
    TD_CHECK_STR_EQ(td_pg_backend(pg), "auto");
    return pg;
}

static td_auto_topology topology(td_pg *pg)
{
    td_auto_topology t;
    auto_backend_topology(pg->state, &t);
    return t;
}

/* ---- what auto makes of a group --------------------------------------------------------------- */

TD_TEST(one_host_runs_shm, .world_size = 3, .timeout_s = 60)
{
    td_pg *pg = make_group(ctx);
    td_auto_topology t = topology(pg);
    TD_CHECK_STR_EQ(t.runs_as, "shm");
    TD_CHECK_EQ(t.nhosts, 1);
    TD_CHECK_EQ(t.local_size, 3);
    td_pg_destroy(pg);
}

TD_TEST(one_rank_per_host_runs_tcp, .world_size = 3, .timeout_s = 60)
{
    set_host(ctx->rank);
    td_pg *pg = make_group(ctx);
    td_auto_topology t = topology(pg);
    TD_CHECK_STR_EQ(t.runs_as, "tcp");
    TD_CHECK_EQ(t.nhosts, 3);
    td_pg_destroy(pg);
}

/* 2 hosts x 2 ranks: hierarchical; the tcp transport reaches the other host over TCP proper and
 * this host's peer over a UNIX socket; the shm transport holds this host's two ranks. */
TD_TEST(two_by_two_is_hierarchical_over_tcp, .world_size = 4, .timeout_s = 60)
{
    set_host(ctx->rank / 2);
    td_pg *pg = make_group(ctx);
    td_auto_topology t = topology(pg);
    TD_CHECK_STR_EQ(t.runs_as, "hierarchical");
    TD_CHECK_EQ(t.nhosts, 2);
    TD_CHECK_EQ(t.host, ctx->rank / 2);
    TD_CHECK_EQ(t.local_size, 2);
    TD_CHECK_EQ(t.local_rank, ctx->rank % 2);
    TD_CHECK(t.shm != NULL && t.tcp != NULL);
    for (int r = 0; r < 4; r++)
        if (r != ctx->rank)
            TD_CHECK_MSG(tcp_transport_peer_is_local(t.tcp, r) == (r / 2 == ctx->rank / 2),
                         "rank %d: the connection to rank %d is %s", ctx->rank, r,
                         tcp_transport_peer_is_local(t.tcp, r) ? "a UNIX socket" : "TCP");
    td_tensor *x = pg_test_tensor(TD_FLOAT32, ctx->rank, 1000);
    TD_CHECK_OK(td_pg_all_reduce(pg, x, TD_OP_SUM, NULL));
    for (int64_t i = 0; i < 1000; i++)
        TD_CHECK_EQ(pg_test_get(x, i), pg_test_expected(TD_FLOAT32, TD_OP_SUM, 4, i));
    td_tensor_release(x);
    td_pg_destroy(pg);
}

/* ---- every collective with interleaved hosts -------------------------------------------------- */

static double at(void *arg, int64_t i) { return ((double *)arg)[i]; }

static void check_expected(const td_tensor *t, td_dtype dt, td_op op, int ws, const char *what)
{
    int64_t n = td_tensor_numel(t);
    double *want = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        want[i] = pg_test_expected(dt, op, ws, i);
    pg_test_check_values(t, at, want, what);
    free(want);
}

/* Hosts {0, 2} and {1, 3} (leaders 0 and 1): every collective, every root, on sizes that fit a
 * small slot and sizes that span many large ones. */
TD_TEST(interleaved_hosts_every_collective, .world_size = 4, .timeout_s = 120)
{
    int me = ctx->rank, ws = ctx->world_size;
    set_host(me % 2);
    td_pg *pg = make_group(ctx);
    TD_CHECK_STR_EQ(topology(pg).runs_as, "hierarchical");
    const int64_t sizes[] = {0, 1, 7, 3000, 700001};
    const td_op ops[] = {TD_OP_SUM, TD_OP_MAX, TD_OP_AVG, TD_OP_PREMUL_SUM(0.5), TD_OP_PRODUCT};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
            td_dtype dt = k == 4 ? TD_INT64 : TD_FLOAT32;
            td_tensor *t = pg_test_tensor(dt, me, n);
            TD_CHECK_OK(td_pg_all_reduce(pg, t, ops[k], NULL));
            check_expected(t, dt, ops[k], ws, "all_reduce");
            td_tensor_release(t);
        }
        for (int root = 0; root < ws; root++) {
            td_tensor *t = pg_test_tensor(TD_FLOAT64, me, n);
            TD_CHECK_OK(td_pg_reduce(pg, t, root, TD_OP_AVG, NULL));
            if (me == root)
                check_expected(t, TD_FLOAT64, TD_OP_AVG, ws, "reduce");
            td_tensor_release(t);
            t = pg_test_tensor(TD_INT32, me, n);
            TD_CHECK_OK(td_pg_broadcast(pg, t, root, NULL));
            for (int64_t i = 0; i < n; i++)
                TD_CHECK_MSG(pg_test_get(t, i) == pg_test_value(TD_INT32, root, i), "broadcast from %d: %lld", root,
                             (long long)i);
            td_tensor_release(t);
            /* gather and scatter */
            td_tensor *in = pg_test_tensor(TD_FLOAT32, me, n), *outs[4] = {0};
            for (int r = 0; r < ws; r++)
                TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(n), &outs[r]));
            TD_CHECK_OK(td_pg_gather(pg, me == root ? outs : NULL, in, root, NULL));
            if (me == root)
                for (int r = 0; r < ws; r++)
                    for (int64_t i = 0; i < n; i++)
                        TD_CHECK(pg_test_get(outs[r], i) == pg_test_value(TD_FLOAT32, r, i));
            td_tensor *sc[4];
            for (int r = 0; r < ws; r++)
                sc[r] = pg_test_tensor(TD_FLOAT32, r + 10, n);
            TD_CHECK_OK(td_pg_scatter(pg, in, me == root ? sc : NULL, root, NULL));
            for (int64_t i = 0; i < n; i++)
                TD_CHECK(pg_test_get(in, i) == pg_test_value(TD_FLOAT32, me + 10, i));
            for (int r = 0; r < ws; r++) {
                td_tensor_release(outs[r]);
                td_tensor_release(sc[r]);
            }
            td_tensor_release(in);
        }
        /* all_gather, reduce_scatter, all_to_all, barrier */
        td_tensor *in = pg_test_tensor(TD_FLOAT32, me, n), *outs[4];
        for (int r = 0; r < ws; r++)
            TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(n), &outs[r]));
        TD_CHECK_OK(td_pg_all_gather(pg, outs, in, NULL));
        for (int r = 0; r < ws; r++)
            for (int64_t i = 0; i < n; i++)
                TD_CHECK(pg_test_get(outs[r], i) == pg_test_value(TD_FLOAT32, r, i));
        td_tensor *rs[4];
        for (int r = 0; r < ws; r++)
            rs[r] = pg_test_tensor(TD_FLOAT32, me, n);
        TD_CHECK_OK(td_pg_reduce_scatter(pg, in, rs, TD_OP_SUM, NULL));
        check_expected(in, TD_FLOAT32, TD_OP_SUM, ws, "reduce_scatter");
        TD_CHECK_OK(td_pg_all_to_all(pg, outs, rs, NULL));
        for (int r = 0; r < ws; r++)
            for (int64_t i = 0; i < n; i++)
                TD_CHECK(pg_test_get(outs[r], i) == pg_test_value(TD_FLOAT32, r, i));
        for (int r = 0; r < ws; r++) {
            td_tensor_release(outs[r]);
            td_tensor_release(rs[r]);
        }
        td_tensor_release(in);
        TD_CHECK_OK(td_pg_barrier(pg, NULL));
    }
    /* Point to point across and within hosts, any-source included. */
    td_tensor *v = NULL;
    TD_CHECK_OK(td_tensor_zeros(TD_INT32, TD_SHAPE(3), &v));
    if (me == 0) {
        int seen = 0;
        for (int k = 0; k < 3; k++) {
            int sender = -1;
            TD_CHECK_OK(td_pg_recv(pg, v, TD_ANY_SOURCE, 5, &sender, NULL));
            TD_CHECK(sender >= 1 && sender <= 3);
            TD_CHECK_EQ(pg_test_get(v, 2), sender * 100);
            seen |= 1 << sender;
        }
        TD_CHECK_EQ(seen, 0xE);
    } else {
        int64_t i = 2;
        TD_CHECK_OK(td_tensor_set_f64(v, &i, me * 100));
        TD_CHECK_OK(td_pg_send(pg, v, 0, 5, NULL));
    }
    td_tensor_release(v);
    td_pg_destroy(pg);
}

/* ---- a rank killed in the middle of a hierarchical all_reduce --------------------------------- */

static void killed_body(td_test_ctx *ctx, int victim)
{
    set_host(ctx->rank / 2);
    td_pg *pg = make_group(ctx);
    td_tensor *t = pg_test_tensor(TD_FLOAT32, ctx->rank, 1 << 20);
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_SUM, NULL));
    char path[1024];
    snprintf(path, sizeof path, "%s/kill_time", ctx->tmpdir);
    if (ctx->rank == victim) {
        clock_sleep_ms(300);
        FILE *fp = fopen(path, "w");
        fprintf(fp, "%lld\n", (long long)clock_now_ms());
        fclose(fp);
        raise(SIGKILL);
    }
    td_status st = td_pg_all_reduce(pg, t, TD_OP_SUM, NULL);
    int64_t failed_at = clock_now_ms();
    char name[32];
    snprintf(name, sizeof name, "rank %d", victim);
    TD_CHECK_ERR(st, TD_ERR_PEER_LOST, name);
    FILE *fp = fopen(path, "r");
    TD_CHECK(fp != NULL);
    long long killed_at = 0;
    TD_CHECK(fscanf(fp, "%lld", &killed_at) == 1);
    fclose(fp);
    TD_CHECK_MSG(failed_at - killed_at < 2000, "survivor failed %lld ms after the kill",
                 (long long)(failed_at - killed_at));
    TD_CHECK_ERR(td_pg_barrier(pg, NULL), TD_ERR_PEER_LOST, name);
    tu_no_segments();
    td_tensor_release(t);
    td_pg_destroy(pg);
}

TD_TEST(non_leader_killed_mid_all_reduce, .world_size = 4, .skip_return_code_check = true,
        .allow_leftovers = true, .timeout_s = 90)
{
    killed_body(ctx, 3);
}

TD_TEST(leader_killed_mid_all_reduce, .world_size = 4, .skip_return_code_check = true, .allow_leftovers = true,
        .timeout_s = 90)
{
    killed_body(ctx, 2);
}

TD_TEST_MAIN()
