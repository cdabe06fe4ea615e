/* The shared-memory collectives (src/backends/shm/direct.h) and every transport algorithm of src/coll
 * over the shm transport, between real rank processes, for world sizes 1 to 4: each direct
 * algorithm forced (and the automatic choice), sizes 0, 1, odd, and many times a slot (the slots
 * are cut to 4 KiB so that chunking runs on small data), several dtypes and reduce ops (AVG and
 * PREMUL_SUM included), every root, aliased in-place buffers, slot writes through the caches, around
 * them and as measured. Results are checked against references each rank computes locally, and
 * inexact floating-point all_reduce results must be bit-identical on every rank. Also: ranks that
 * disagree about a collective fail at once, a rank killed mid-collective fails the others within
 * 2 s naming it, a stalled rank times out, and four ranks on one core make progress. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../support/coll_check.h"
#include "base/clock.h"
#include "backends/shm/direct.h"
#include "shm_util.h"

/* Direct algorithms forced per kind (the others run through the transport algorithms). */
static td_status run_forced(td_coll_ctx *c, const td_coll *op, td_algo forced)
{
    c->cfg.forced[op->kind] = forced;
    return shm_coll_run(c, op);
}

/* Slots of 4 KiB (the small ones 1 KiB): chunking runs on small data. writes: this rank's
 * TDIST_SHM_WRITES, or NULL. */
static cc_world open_cw_writes(td_test_ctx *ctx, const char *algo, const char *writes)
{
    setenv("TDIST_SHM_SLOT", "4K", 1);
    setenv("TDIST_SHM_SMALL", "1K", 1);
    if (writes)
        setenv("TDIST_SHM_WRITES", writes, 1);
    cc_world w = {0};
    w.tw = shm_test_open(ctx, 0);
    unsetenv("TDIST_SHM_SLOT");
    unsetenv("TDIST_SHM_SMALL");
    unsetenv("TDIST_SHM_WRITES");
    cc_world_init(&w, 4096, 2048, algo, run_forced);
    return w;
}
static cc_world open_cw(td_test_ctx *ctx, const char *algo) { return open_cw_writes(ctx, algo, NULL); }

static const cc_combo combos[] = {
    {TD_FLOAT32, TD_OP_SUM},  {TD_FLOAT32, TD_OP_MAX}, {TD_FLOAT64, TD_OP_PRODUCT}, {TD_INT32, TD_OP_MIN},
    {TD_INT64, TD_OP_BXOR},   {TD_UINT8, TD_OP_BOR},   {TD_BFLOAT16, TD_OP_SUM},    {TD_FLOAT32, TD_OP_AVG},
    {TD_FLOAT16, TD_OP_AVG},  {TD_FLOAT64, TD_OP_PREMUL_SUM(0.5)}, {TD_INT32, TD_OP_BAND},
};
#define NCOMBOS (sizeof combos / sizeof combos[0])
/* 0, 1, odd, about a small slot, several large slots (4 KiB each). */
static const size_t sizes[] = {0, 1, 7, 250, 1000, 20011};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* ---- reductions ------------------------------------------------------------------------------- */

static const td_algo reduce_algos[] = {TD_ALGO_SHM, TD_ALGO_SHM_FLAT, TD_ALGO_AUTO};

CC_COLL_TEST(all_reduce, .timeout_s = 120)
{
    cc_world w = open_cw(ctx, NULL);
    cc_case_all_reduce(&w, reduce_algos, 3, combos, NCOMBOS, sizes, NSIZES);
    cc_world_close(&w);
}

CC_COLL_TEST(reduce, .timeout_s = 120)
{
    cc_world w = open_cw(ctx, NULL);
    for (size_t a = 0; a < 3; a++) {
        for (int root = 0; root < ctx->world_size; root++) {
            for (size_t k = 0; k < NCOMBOS; k += 3) {
                for (size_t s = 0; s < NSIZES; s++) {
                    size_t n = sizes[s];
                    void *buf = cc_filled(combos[k].dt, combos[k].op.kind, ctx->rank, n);
                    td_coll c = cc_coll_of(&w, TD_COLL_REDUCE, combos[k].dt, n);
                    c.op = combos[k].op;
                    c.root = root;
                    c.in = c.out = buf;
                    cc_run(&w, &c, reduce_algos[a], "reduce");
                    if (ctx->rank == root)
                        cc_check_buf(combos[k].dt, combos[k].op, buf, n, ctx->world_size, 0, "reduce");
                    free(buf);
                }
            }
        }
    }
    cc_world_close(&w);
}

/* Inexact sums (values of every magnitude) still give the same bits on every rank. */
CC_COLL_TEST(all_reduce_bit_identical, .timeout_s = 120)
{
    cc_world w = open_cw(ctx, NULL);
    cc_case_all_reduce_bit_identical(&w, reduce_algos, 3);
    cc_world_close(&w);
}

/* Slot writes around the caches (streaming stores, chunks reduced on the stack) on every rank:
 * the same results, the same bits. */
static void all_reduce_written(td_test_ctx *ctx, const char *writes)
{
    cc_world w = open_cw_writes(ctx, NULL, writes);
    static const td_algo shm_only[] = {TD_ALGO_SHM};
    cc_case_all_reduce(&w, shm_only, 1, combos, NCOMBOS, sizes, NSIZES);
    cc_case_all_reduce_bit_identical(&w, shm_only, 1);
    cc_world_close(&w);
}
CC_COLL_TEST(all_reduce_written_around_the_caches, .timeout_s = 120) { all_reduce_written(ctx, "around"); }
/* The way is each rank's own: even ranks around the caches, odd ones through them. */
CC_COLL_TEST(all_reduce_written_both_ways, .timeout_s = 120)
{
    all_reduce_written(ctx, ctx->rank % 2 ? "cached" : "around");
}

/* The measured choice (default slots; chunks of 2 MiB and 0.5 MiB, both timed): 40 all_reduces of
 * 2.5 MB, in which every rank writes the trial chunks both ways, then follows rank 0's plan, each
 * result checked. */
CC_COLL_TEST(all_reduce_ways_measured, .timeout_s = 120)
{
    cc_world w = {0};
    w.tw = shm_test_open(ctx, 0);
    cc_world_init(&w, (size_t)1 << 20, (size_t)64 << 10, NULL, run_forced);
    static const td_algo shm_only[] = {TD_ALGO_SHM};
    static const cc_combo sum[] = {{TD_FLOAT32, TD_OP_SUM}};
    static const size_t big[] = {655360};
    for (int k = 0; k < 40; k++)
        cc_case_all_reduce(&w, shm_only, 1, sum, 1, big, 1);
    cc_world_close(&w);
}

/* Default slots: a reduction whose ranks' buffers together fit in 24 MiB moves in 2 MiB chunks, a
 * larger one in 1 MiB chunks (backends/shm/direct.c); just below and above the line, each with a
 * partial last chunk, checked. */
CC_COLL_TEST(all_reduce_chunks_by_size, .timeout_s = 120)
{
    cc_world w = {0};
    w.tw = shm_test_open(ctx, 0);
    cc_world_init(&w, (size_t)2 << 20, (size_t)64 << 10, NULL, run_forced);
    static const td_algo shm_only[] = {TD_ALGO_SHM};
    static const cc_combo combos2[] = {{TD_FLOAT32, TD_OP_SUM}, {TD_INT32, TD_OP_MAX}};
    size_t line = ((size_t)24 << 20) / (size_t)ctx->world_size / 4; /* elements of 4 bytes */
    const size_t around_line[] = {line - 4099, line + 65537};
    cc_case_all_reduce(&w, shm_only, 1, combos2, 2, around_line, 2);
    cc_world_close(&w);
}

CC_COLL_TEST(reduce_scatter, .timeout_s = 120)
{
    cc_world w = open_cw(ctx, NULL);
    int ws = ctx->world_size;
    for (size_t k = 0; k < NCOMBOS; k++) {
        for (size_t s = 0; s < NSIZES; s++) {
            size_t n = sizes[s];
            td_dtype dt = combos[k].dt;
            /* Block r of every rank holds the values of elements r*n .. r*n+n-1. */
            void **in = cc_blocks(ws, n, dt);
            for (int r = 0; r < ws; r++)
                for (size_t i = 0; i < n; i++)
                    cc_put(dt, in[r], i, cc_value(combos[k].op.kind, ctx->rank, (size_t)r * n + i));
            void *out = calloc(n + 1, td_dtype_size(dt));
            td_coll c = cc_coll_of(&w, TD_COLL_REDUCE_SCATTER, dt, n);
            c.op = combos[k].op;
            c.in_blocks = (const void *const *)in;
            c.out = out;
            cc_run(&w, &c, TD_ALGO_SHM, "reduce_scatter");
            cc_check_buf(dt, combos[k].op, out, n, ws, (size_t)ctx->rank * n, "reduce_scatter");
            free(out);
            cc_free_blocks(in, ws);
        }
    }
    cc_world_close(&w);
}

/* ---- copies ----------------------------------------------------------------------------------- */

CC_COLL_TEST(copies, .timeout_s = 120)
{
    cc_world w = open_cw(ctx, NULL);
    int ws = ctx->world_size, me = ctx->rank;
    for (size_t s = 0; s < NSIZES; s++) {
        size_t n = sizes[s];
        for (int root = 0; root < ws; root++) {
            float *buf = cc_filled(TD_FLOAT32, TD_SUM, me, n);
            td_coll c = cc_coll_of(&w, TD_COLL_BROADCAST, TD_FLOAT32, n);
            c.root = root;
            c.in = c.out = buf;
            cc_run(&w, &c, TD_ALGO_SHM, "broadcast");
            for (size_t i = 0; i < n; i++)
                TD_CHECK_MSG(buf[i] == (float)cc_value(TD_SUM, root, i), "broadcast from %d: element %zu", root, i);
            free(buf);

            /* gather to root, scatter from root */
            float *in = cc_filled(TD_FLOAT32, TD_SUM, me, n);
            void **out = cc_blocks(ws, n, TD_FLOAT32);
            c = cc_coll_of(&w, TD_COLL_GATHER, TD_FLOAT32, n);
            c.root = root;
            c.in = in;
            c.out_blocks = me == root ? out : NULL;
            cc_run(&w, &c, TD_ALGO_SHM, "gather");
            if (me == root)
                for (int r = 0; r < ws; r++)
                    for (size_t i = 0; i < n; i++)
                        TD_CHECK_MSG(((float *)out[r])[i] == (float)cc_value(TD_SUM, r, i),
                                     "gather: rank %d element %zu", r, i);
            void **sin = cc_blocks(ws, n, TD_FLOAT32);
            for (int r = 0; r < ws; r++)
                for (size_t i = 0; i < n; i++)
                    ((float *)sin[r])[i] = (float)cc_value(TD_SUM, r + 7, i);
            float *sout = calloc(n + 1, sizeof(float));
            c = cc_coll_of(&w, TD_COLL_SCATTER, TD_FLOAT32, n);
            c.root = root;
            c.in_blocks = me == root ? (const void *const *)sin : NULL;
            c.out = sout;
            cc_run(&w, &c, TD_ALGO_SHM, "scatter");
            for (size_t i = 0; i < n; i++)
                TD_CHECK_MSG(sout[i] == (float)cc_value(TD_SUM, me + 7, i), "scatter from %d: element %zu", root, i);
            free(sout);
            cc_free_blocks(sin, ws);
            cc_free_blocks(out, ws);
            free(in);
        }
        /* all_gather, in place: rank r's input is its own output block */
        void **out = cc_blocks(ws, n, TD_FLOAT64);
        for (size_t i = 0; i < n; i++)
            ((double *)out[me])[i] = cc_value(TD_SUM, me, i);
        td_coll c = cc_coll_of(&w, TD_COLL_ALL_GATHER, TD_FLOAT64, n);
        c.in = out[me];
        c.out_blocks = out;
        cc_run(&w, &c, TD_ALGO_SHM, "all_gather");
        for (int r = 0; r < ws; r++)
            for (size_t i = 0; i < n; i++)
                TD_CHECK_MSG(((double *)out[r])[i] == cc_value(TD_SUM, r, i), "all_gather: rank %d element %zu", r, i);
        cc_free_blocks(out, ws);
        c = cc_coll_of(&w, TD_COLL_BARRIER, TD_FLOAT32, 0);
        cc_run(&w, &c, TD_ALGO_SHM, "barrier");
    }
    cc_world_close(&w);
}

/* ---- every transport algorithm over the shm transport ----------------------------------------- */

CC_COLL_TEST(transport_algorithms, .timeout_s = 120)
{
    cc_world w = open_cw(ctx, NULL);
    int ws = ctx->world_size, me = ctx->rank;
    const td_algo ar[] = {TD_ALGO_RD, TD_ALGO_RING, TD_ALGO_RHD, TD_ALGO_TREE};
    const size_t ns[] = {0, 1, 7, 20011};
    for (size_t s = 0; s < 4; s++) {
        size_t n = ns[s];
        for (size_t a = 0; a < 4; a++) {
            void *buf = cc_filled(TD_INT32, TD_SUM, me, n);
            td_coll c = cc_coll_of(&w, TD_COLL_ALL_REDUCE, TD_INT32, n);
            c.in = c.out = buf;
            cc_run(&w, &c, ar[a], "all_reduce");
            cc_check_buf(TD_INT32, TD_OP_SUM, buf, n, ws, 0, coll_algo_name(ar[a]));
            free(buf);
        }
        for (int chain = 0; chain < 2; chain++) {
            float *buf = cc_filled(TD_FLOAT32, TD_SUM, me, n);
            td_coll c = cc_coll_of(&w, TD_COLL_BROADCAST, TD_FLOAT32, n);
            c.root = ws - 1;
            c.in = c.out = buf;
            cc_run(&w, &c, chain ? TD_ALGO_RING : TD_ALGO_TREE, "broadcast");
            for (size_t i = 0; i < n; i++)
                TD_CHECK(buf[i] == (float)cc_value(TD_SUM, ws - 1, i));
            free(buf);
        }
        for (int bruck = 0; bruck < 2; bruck++) {
            void **out = cc_blocks(ws, n, TD_INT64);
            void *in = cc_filled(TD_INT64, TD_SUM, me, n);
            td_coll c = cc_coll_of(&w, TD_COLL_ALL_GATHER, TD_INT64, n);
            c.in = in;
            c.out_blocks = out;
            cc_run(&w, &c, bruck ? TD_ALGO_BRUCK : TD_ALGO_RING, "all_gather");
            for (int r = 0; r < ws; r++)
                for (size_t i = 0; i < n; i++)
                    TD_CHECK(((int64_t *)out[r])[i] == (int64_t)cc_value(TD_SUM, r, i));
            free(in);
            cc_free_blocks(out, ws);
        }
        for (int direct = 0; direct < 2; direct++) {
            /* all_to_all with uneven counts: rank r sends r + q + (n % 5) elements to q */
            size_t *ic = calloc((size_t)ws, sizeof *ic), *oc = calloc((size_t)ws, sizeof *oc);
            void **in = calloc((size_t)ws, sizeof *in), **out = calloc((size_t)ws, sizeof *out);
            for (int q = 0; q < ws; q++) {
                ic[q] = (size_t)(me + q) + n % 5;
                oc[q] = (size_t)(q + me) + n % 5;
                in[q] = calloc(ic[q] + 1, sizeof(int32_t));
                out[q] = calloc(oc[q] + 1, sizeof(int32_t));
                for (size_t i = 0; i < ic[q]; i++)
                    ((int32_t *)in[q])[i] = me * 1000 + q * 100 + (int32_t)i;
            }
            td_coll c = cc_coll_of(&w, TD_COLL_ALL_TO_ALL, TD_INT32, 0);
            c.in_blocks = (const void *const *)in;
            c.in_counts = ic;
            c.out_blocks = out;
            c.out_counts = oc;
            cc_run(&w, &c, direct ? TD_ALGO_DIRECT : TD_ALGO_PAIRWISE, "all_to_all");
            for (int q = 0; q < ws; q++)
                for (size_t i = 0; i < oc[q]; i++)
                    TD_CHECK(((int32_t *)out[q])[i] == q * 1000 + me * 100 + (int32_t)i);
            for (int q = 0; q < ws; q++) {
                free(in[q]);
                free(out[q]);
            }
            free(in);
            free(out);
            free(ic);
            free(oc);
        }
        td_coll c = cc_coll_of(&w, TD_COLL_BARRIER, TD_FLOAT32, 0);
        cc_run(&w, &c, TD_ALGO_DISSEMINATION, "barrier");
    }
    cc_world_close(&w);
}

/* Eight ranks (on a machine with fewer cores): every direct algorithm still gives the right
 * result. */
TD_TEST(eight_ranks, .world_size = 8, .timeout_s = 120)
{
    cc_world w = open_cw(ctx, NULL);
    const size_t ns[] = {1, 100, 5000};
    for (size_t s = 0; s < 3; s++) {
        size_t n = ns[s];
        for (size_t a = 0; a < 2; a++) {
            void *buf = cc_filled(TD_FLOAT64, TD_SUM, ctx->rank, n);
            td_coll c = cc_coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT64, n);
            c.in = c.out = buf;
            cc_run(&w, &c, reduce_algos[a], "all_reduce");
            cc_check_buf(TD_FLOAT64, TD_OP_SUM, buf, n, 8, 0, coll_algo_name(reduce_algos[a]));
            free(buf);
        }
        void **out = cc_blocks(8, n, TD_INT32);
        void *in = cc_filled(TD_INT32, TD_SUM, ctx->rank, n);
        td_coll c = cc_coll_of(&w, TD_COLL_ALL_GATHER, TD_INT32, n);
        c.in = in;
        c.out_blocks = out;
        cc_run(&w, &c, TD_ALGO_SHM, "all_gather");
        for (int r = 0; r < 8; r++)
            for (size_t i = 0; i < n; i++)
                TD_CHECK(((int32_t *)out[r])[i] == (int32_t)cc_value(TD_SUM, r, i));
        free(in);
        cc_free_blocks(out, 8);
    }
    cc_world_close(&w);
}

/* ---- failures --------------------------------------------------------------------------------- */

/* Ranks that run different collectives (here: different sizes) fail at once on every rank with a
 * message that names both, instead of mixing their data. */
TD_TEST(disagreement_fails_every_rank, .world_size = 3, .timeout_s = 60)
{
    cc_world w = open_cw(ctx, NULL);
    size_t n = ctx->rank == 1 ? 100 : 200;
    float *buf = cc_filled(TD_FLOAT32, TD_SUM, ctx->rank, n);
    td_coll c = cc_coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, n);
    c.in = c.out = buf;
    w.c.cfg.forced[TD_COLL_ALL_REDUCE] = TD_ALGO_SHM;
    int64_t t0 = clock_now_ns();
    TD_CHECK_ERR(shm_coll_run(&w.c, &c), TD_ERR_INVALID, "Ranks disagree about collective #1");
    TD_CHECK_CONTAINS(td_last_error(), "all_reduce(float32, 100 elements, sum)");
    TD_CHECK(tu_since_s(t0) < 10);
    free(buf);
    tu_barrier(ctx, w.tw.store, "done");
    cc_world_close(&w);
}

/* Rank 2 dies (SIGKILL) while the others are inside a direct all_reduce, waiting for it: both fail
 * within 2 s with TD_ERR_PEER_LOST naming rank 2, the next collective fails the same way, and no
 * segment is left in /dev/shm. */
TD_TEST(peer_killed_mid_collective, .world_size = 3, .skip_return_code_check = true, .allow_leftovers = true,
        .timeout_s = 60)
{
    cc_world w = open_cw(ctx, NULL);
    size_t n = 100000; /* many slots */
    float *buf = cc_filled(TD_FLOAT32, TD_SUM, ctx->rank, n);
    td_coll c = cc_coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, n);
    c.in = c.out = buf;
    cc_run(&w, &c, TD_ALGO_AUTO, "all_reduce");
    if (ctx->rank == 2) {
        clock_sleep_ms(300);
        raise(SIGKILL);
    }
    c = cc_coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, n);
    c.in = c.out = buf;
    int64_t t0 = clock_now_ns();
    TD_CHECK_ERR(shm_coll_run(&w.c, &c), TD_ERR_PEER_LOST, "Connection to rank 2 lost");
    double dt = tu_since_s(t0);
    TD_CHECK_MSG(dt < 2.3, "the loss of rank 2 took %.2f s to notice (the kill came at 0.3 s)", dt);
    c = cc_coll_of(&w, TD_COLL_BROADCAST, TD_FLOAT32, 4);
    c.in = c.out = buf;
    TD_CHECK_ERR(shm_coll_run(&w.c, &c), TD_ERR_PEER_LOST, "Connection to rank 2 lost");
    tu_no_segments();
    free(buf);
    w.tw.keep_store = true;
    cc_world_close(&w);
}

/* A rank that stalls: the waiting rank fails at its deadline, and the stalled one at once when it
 * comes (the abort was relayed). */
TD_TEST(stalled_rank_times_out, .world_size = 2, .timeout_s = 60)
{
    cc_world w = open_cw(ctx, NULL);
    float v = 1;
    td_coll c = cc_coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, 1);
    c.in = c.out = &v;
    if (ctx->rank == 0) {
        c.deadline_ns = clock_now_ns() + 300 * 1000000LL;
        int64_t t0 = clock_now_ns();
        TD_CHECK_ERR(shm_coll_run(&w.c, &c), TD_ERR_TIMEOUT, "waiting for rank 1 in a shared-memory collective");
        TD_CHECK(tu_since_s(t0) >= 0.29 && tu_since_s(t0) < 10);
        TD_CHECK_OK(td_store_set_str(w.tw.store, "timed_out", "1"));
    } else {
        const char *k = "timed_out";
        TD_CHECK_OK(td_store_wait(w.tw.store, &k, 1, 30000));
        /* The relayed abort reaches this rank's transport (a receive fails with it), and every
         * collective after it fails the same way. */
        char b[4];
        TD_CHECK_ERR(transport_recv(w.tw.t, 0, 1, b, 4, tu_after_ms(30000)), TD_ERR_TIMEOUT, "waiting for rank 1");
        TD_CHECK_ERR(shm_coll_run(&w.c, &c), TD_ERR_TIMEOUT, "waiting for rank 1");
    }
    cc_world_close(&w);
}

/* Four ranks on one core: a thousand small all_reduces and some large ones still go through. */
TD_TEST(four_ranks_one_core, .world_size = 4, .timeout_s = 120)
{
    tu_one_core();
    cc_world w = open_cw(ctx, NULL);
    int64_t t0 = clock_now_ns();
    float v[2];
    for (int i = 0; i < 1000; i++) {
        v[0] = (float)ctx->rank;
        v[1] = 1;
        td_coll c = cc_coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, 2);
        c.in = c.out = v;
        cc_run(&w, &c, TD_ALGO_AUTO, "all_reduce");
        TD_CHECK(v[0] == 6 && v[1] == 4);
    }
    size_t n = 50000;
    for (int i = 0; i < 5; i++) {
        float *buf = cc_filled(TD_FLOAT32, TD_SUM, ctx->rank, n);
        td_coll c = cc_coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, n);
        c.in = c.out = buf;
        cc_run(&w, &c, TD_ALGO_AUTO, "all_reduce");
        cc_check_buf(TD_FLOAT32, TD_OP_SUM, buf, n, 4, 0, "all_reduce");
        free(buf);
    }
    double dt = tu_since_s(t0);
    TD_CHECK_MSG(dt < 60, "4 ranks on one core took %.1f s", dt);
    tu_barrier(ctx, w.tw.store, "done");
    cc_world_close(&w);
}

TD_TEST_MAIN()
