/* Every collective algorithm of src/coll, forced one by one, over the tcp transport between real
 * rank processes, for world sizes 1 to 4: sizes 0, 1, odd and multi-chunk (the chunk size is cut
 * to 4 KiB so that pipelining runs on small data), several dtypes and reduce ops, every root,
 * uneven all_to_all splits and aliased in-place buffers. Results are checked against references
 * each rank computes locally from the same deterministic inputs (small integers, so every
 * reduction order gives the exact same value), and all_reduce results of inexact floating-point
 * sums are checked to be bit-identical across ranks (through the store, not the transport).
 * Also: TDIST_ALGO parsing and its errors, and failures (sizes that disagree, a rank that never
 * comes) that must fail every rank promptly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/backend.h>
#include <tdist/pg.h>
#include <tdist/store.h>
#include <tdist/testing.h>

#include "../support/coll_check.h"
#include "base/clock.h"
#include "coll/coll.h"
#include "transport/tcp.h"

/* The registry refers to the built-in backends weakly, which does not pull them out of the static
 * library this test links; this strong reference does. */
extern const td_backend_ops backend_tcp_ops;
__attribute__((used)) static const td_backend_ops *const link_tcp_backend = &backend_tcp_ops;

/* ---- set-up ----------------------------------------------------------------------------------- */

static cc_world open_cw_chunk(td_test_ctx *ctx, size_t chunk)
{
    cc_world w = {0};
    w.tw.ctx = ctx;
    w.tw.store = tu_store_open(ctx->store_path);
    td_tcp_options o = {.setup = tu_setup(ctx, w.tw.store, 30000, "coll")};
    TD_CHECK_OK(tcp_transport_create(&o, &w.tw.t));
    cc_world_init(&w, chunk, 2048, NULL, coll_execute);
    return w;
}

/* Chunks of 4 KiB, so that pipelining runs on small data. */
static cc_world open_cw(td_test_ctx *ctx) { return open_cw_chunk(ctx, 4096); }

/* ---- values ----------------------------------------------------------------------------------- */

static const cc_combo combos[] = {
    {TD_FLOAT32, TD_OP_SUM},  {TD_FLOAT32, TD_OP_MAX},    {TD_FLOAT64, TD_OP_PRODUCT},
    {TD_INT32, TD_OP_MIN},    {TD_INT32, TD_OP_BXOR},     {TD_INT64, TD_OP_BOR},
    {TD_BFLOAT16, TD_OP_SUM}, {TD_FLOAT32, TD_OP_AVG},    {TD_FLOAT16, TD_OP_AVG},
    {TD_FLOAT64, TD_OP_PREMUL_SUM(0.5)},
};
#define NCOMBOS (sizeof combos / sizeof combos[0])
static const size_t sizes[] = {0, 1, 7, 1000, 20011};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* ---- all_reduce ------------------------------------------------------------------------------- */

static const td_algo allreduce_algos[] = {TD_ALGO_RD, TD_ALGO_RING, TD_ALGO_RHD, TD_ALGO_TREE, TD_ALGO_AUTO};

CC_COLL_TEST(all_reduce, .timeout_s = 120)
{
    cc_world w = open_cw(ctx);
    cc_case_all_reduce(&w, allreduce_algos, sizeof allreduce_algos / sizeof allreduce_algos[0], combos, NCOMBOS,
                       sizes, NSIZES);
    cc_world_close(&w);
}

/* Inexact sums (values of every magnitude) must still give the same bits on every rank. */
CC_COLL_TEST(all_reduce_bit_identical, .timeout_s = 120)
{
    cc_world w = open_cw(ctx);
    cc_case_all_reduce_bit_identical(&w, allreduce_algos, sizeof allreduce_algos / sizeof allreduce_algos[0]);
    cc_world_close(&w);
}

/* Large messages with the default chunk size: between ranks of one host these chunks go by single
 * copy from the sender's memory (transport/tcp.h). */
CC_COLL_TEST(large_messages, .timeout_s = 120)
{
    cc_world w = open_cw_chunk(ctx, 256 << 10);
    int ws = ctx->world_size;
    size_t n = 300007; /* 1.2 MB of float32, several chunks */
    for (size_t a = 0; a < 4; a++) {
        float *buf = cc_filled(TD_FLOAT32, TD_SUM, ctx->rank, n);
        td_coll c = cc_coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, n);
        c.in = c.out = buf;
        cc_run(&w, &c, allreduce_algos[a], "all_reduce");
        cc_check_buf(TD_FLOAT32, TD_OP_SUM, buf, n, ws, 0, coll_algo_name(allreduce_algos[a]));
        free(buf);
    }
    for (int chain = 0; chain < 2; chain++) {
        float *buf = cc_filled(TD_FLOAT32, TD_SUM, ctx->rank, n);
        td_coll c = cc_coll_of(&w, TD_COLL_BROADCAST, TD_FLOAT32, n);
        c.root = ws - 1;
        c.in = c.out = buf;
        cc_run(&w, &c, chain ? TD_ALGO_RING : TD_ALGO_TREE, "broadcast");
        for (size_t i = 0; i < n; i++)
            TD_CHECK_MSG(cc_get(TD_FLOAT32, buf, i) == cc_value(TD_SUM, ws - 1, i), "broadcast element %zu", i);
        free(buf);
        buf = cc_filled(TD_FLOAT32, TD_SUM, ctx->rank, n);
        c = cc_coll_of(&w, TD_COLL_REDUCE, TD_FLOAT32, n);
        c.in = c.out = buf;
        cc_run(&w, &c, chain ? TD_ALGO_RING : TD_ALGO_TREE, "reduce");
        if (ctx->rank == 0)
            cc_check_buf(TD_FLOAT32, TD_OP_SUM, buf, n, ws, 0, "reduce");
        free(buf);
    }
    size_t *counts = calloc((size_t)ws, sizeof *counts);
    void **out = cc_blocks(ws, n, TD_FLOAT32);
    float *in = cc_filled(TD_FLOAT32, TD_SUM, ctx->rank, n);
    for (int r = 0; r < ws; r++)
        counts[r] = n;
    td_coll c = cc_coll_of(&w, TD_COLL_ALL_GATHER, TD_FLOAT32, n);
    c.in = in;
    c.out_blocks = out;
    c.out_counts = counts;
    cc_run(&w, &c, TD_ALGO_RING, "all_gather");
    for (int r = 0; r < ws; r++)
        for (size_t i = 0; i < n; i += 7)
            TD_CHECK_MSG(cc_get(TD_FLOAT32, out[r], i) == cc_value(TD_SUM, r, i), "all_gather block %d element %zu", r,
                         i);
    cc_free_blocks(out, ws);
    free(in);
    free(counts);
    cc_world_close(&w);
}

/* ---- broadcast and reduce --------------------------------------------------------------------- */

CC_COLL_TEST(broadcast, .timeout_s = 120)
{
    cc_world w = open_cw(ctx);
    const td_algo algos[] = {TD_ALGO_TREE, TD_ALGO_RING};
    for (size_t a = 0; a < 2; a++) {
        for (int root = 0; root < ctx->world_size; root++) {
            for (size_t s = 0; s < NSIZES; s++) {
                for (int d = 0; d < 2; d++) {
                    td_dtype dt = d ? TD_INT64 : TD_FLOAT32;
                    size_t n = sizes[s];
                    void *buf = cc_filled(dt, TD_SUM, ctx->rank, n);
                    td_coll c = cc_coll_of(&w, TD_COLL_BROADCAST, dt, n);
                    c.root = root;
                    c.in = c.out = buf;
                    cc_run(&w, &c, algos[a], "broadcast");
                    for (size_t i = 0; i < n; i++)
                        TD_CHECK_MSG(cc_get(dt, buf, i) == cc_value(TD_SUM, root, i),
                                     "broadcast %s root %d: element %zu", coll_algo_name(algos[a]), root, i);
                    free(buf);
                }
            }
        }
    }
    cc_world_close(&w);
}

CC_COLL_TEST(reduce, .timeout_s = 120)
{
    cc_world w = open_cw(ctx);
    const td_algo algos[] = {TD_ALGO_TREE, TD_ALGO_RING};
    const cc_combo cs[] = {{TD_FLOAT32, TD_OP_SUM}, {TD_INT32, TD_OP_MAX}, {TD_FLOAT64, TD_OP_AVG},
                        {TD_FLOAT32, TD_OP_PREMUL_SUM(0.5)}, {TD_INT64, TD_OP_PRODUCT}};
    for (size_t a = 0; a < 2; a++) {
        for (int root = 0; root < ctx->world_size; root++) {
            for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
                for (size_t s = 0; s < NSIZES; s++) {
                    size_t n = sizes[s];
                    void *buf = cc_filled(cs[k].dt, cs[k].op.kind, ctx->rank, n);
                    td_coll c = cc_coll_of(&w, TD_COLL_REDUCE, cs[k].dt, n);
                    c.root = root;
                    c.op = cs[k].op;
                    c.in = c.out = buf;
                    cc_run(&w, &c, algos[a], "reduce");
                    if (ctx->rank == root)
                        cc_check_buf(cs[k].dt, cs[k].op, buf, n, ctx->world_size, 0, "reduce");
                    free(buf);
                }
            }
        }
    }
    cc_world_close(&w);
}

/* ---- gathers and scatters --------------------------------------------------------------------- */

CC_COLL_TEST(all_gather, .timeout_s = 120)
{
    cc_world w = open_cw(ctx);
    int ws = ctx->world_size;
    const td_algo algos[] = {TD_ALGO_RING, TD_ALGO_BRUCK, TD_ALGO_AUTO};
    size_t *counts = calloc((size_t)ws, sizeof *counts);
    for (size_t a = 0; a < 3; a++) {
        for (size_t s = 0; s < NSIZES; s++) {
            for (int inplace = 0; inplace < 2; inplace++) {
                size_t n = sizes[s];
                void **out = cc_blocks(ws, n, TD_FLOAT32);
                void *in = cc_filled(TD_FLOAT32, TD_SUM, ctx->rank, n);
                if (inplace) {
                    memcpy(out[ctx->rank], in, n * 4);
                    free(in);
                    in = out[ctx->rank];
                }
                for (int r = 0; r < ws; r++)
                    counts[r] = n;
                td_coll c = cc_coll_of(&w, TD_COLL_ALL_GATHER, TD_FLOAT32, n);
                c.in = in;
                c.out_blocks = out;
                c.out_counts = counts;
                cc_run(&w, &c, algos[a], "all_gather");
                for (int r = 0; r < ws; r++)
                    for (size_t i = 0; i < n; i++)
                        TD_CHECK_MSG(cc_get(TD_FLOAT32, out[r], i) == cc_value(TD_SUM, r, i),
                                     "all_gather %s: block %d element %zu", coll_algo_name(algos[a]), r, i);
                if (!inplace)
                    free(in);
                cc_free_blocks(out, ws);
            }
        }
    }
    free(counts);
    cc_world_close(&w);
}

CC_COLL_TEST(gather_scatter, .timeout_s = 120)
{
    cc_world w = open_cw(ctx);
    int ws = ctx->world_size;
    const td_algo algos[] = {TD_ALGO_DIRECT, TD_ALGO_TREE};
    size_t *counts = calloc((size_t)ws, sizeof *counts);
    for (size_t a = 0; a < 2; a++) {
        for (int root = 0; root < ws; root++) {
            for (size_t s = 0; s < NSIZES; s++) {
                size_t n = sizes[s];
                for (int r = 0; r < ws; r++)
                    counts[r] = n;
                /* gather */
                void *in = cc_filled(TD_INT32, TD_SUM, ctx->rank, n);
                void **out = ctx->rank == root ? cc_blocks(ws, n, TD_INT32) : NULL;
                td_coll c = cc_coll_of(&w, TD_COLL_GATHER, TD_INT32, n);
                c.root = root;
                c.in = in;
                c.out_blocks = out;
                c.out_counts = out ? counts : NULL;
                cc_run(&w, &c, algos[a], "gather");
                if (out) {
                    for (int r = 0; r < ws; r++)
                        for (size_t i = 0; i < n; i++)
                            TD_CHECK_MSG(cc_get(TD_INT32, out[r], i) == cc_value(TD_SUM, r, i),
                                         "gather %s root %d: block %d element %zu", coll_algo_name(algos[a]), root, r, i);
                    cc_free_blocks(out, ws);
                }
                free(in);
                /* scatter: block r of the root holds cc_value(r + 100) */
                void **ins = NULL;
                if (ctx->rank == root) {
                    ins = cc_blocks(ws, n, TD_INT32);
                    for (int r = 0; r < ws; r++)
                        for (size_t i = 0; i < n; i++)
                            cc_put(TD_INT32, ins[r], i, cc_value(TD_SUM, r + 100, i));
                }
                void *o = calloc(n + 1, 4);
                c = cc_coll_of(&w, TD_COLL_SCATTER, TD_INT32, n);
                c.root = root;
                c.out = o;
                c.in_blocks = (const void *const *)ins;
                c.in_counts = ins ? counts : NULL;
                cc_run(&w, &c, algos[a], "scatter");
                for (size_t i = 0; i < n; i++)
                    TD_CHECK_MSG(cc_get(TD_INT32, o, i) == cc_value(TD_SUM, ctx->rank + 100, i),
                                 "scatter %s root %d: element %zu", coll_algo_name(algos[a]), root, i);
                free(o);
                if (ins)
                    cc_free_blocks(ins, ws);
            }
        }
    }
    free(counts);
    cc_world_close(&w);
}

/* ---- reduce_scatter --------------------------------------------------------------------------- */

CC_COLL_TEST(reduce_scatter, .timeout_s = 120)
{
    cc_world w = open_cw(ctx);
    int ws = ctx->world_size;
    const td_algo algos[] = {TD_ALGO_RING, TD_ALGO_DIRECT, TD_ALGO_AUTO};
    const cc_combo cs[] = {{TD_FLOAT32, TD_OP_SUM}, {TD_INT32, TD_OP_MIN}, {TD_FLOAT64, TD_OP_AVG},
                        {TD_FLOAT32, TD_OP_PREMUL_SUM(0.5)}, {TD_BFLOAT16, TD_OP_MAX}};
    size_t *counts = calloc((size_t)ws, sizeof *counts);
    for (size_t a = 0; a < 3; a++) {
        for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
            for (size_t s = 0; s < NSIZES; s++) {
                for (int inplace = 0; inplace < 2; inplace++) {
                    size_t n = sizes[s];
                    td_dtype dt = cs[k].dt;
                    size_t es = td_dtype_size(dt);
                    /* One flat input; rank r's block is [r*n, (r+1)*n), shifted by r*... so that
                     * every block has its own values: block b of rank p holds cc_value(p, b*n + i). */
                    char *flat = cc_filled(dt, cs[k].op.kind, ctx->rank, n * (size_t)ws);
                    const void **inb = calloc((size_t)ws, sizeof *inb);
                    for (int r = 0; r < ws; r++) {
                        inb[r] = flat + (size_t)r * n * es;
                        counts[r] = n;
                    }
                    void *out = inplace ? (void *)inb[ctx->rank] : calloc(n + 1, es);
                    td_coll c = cc_coll_of(&w, TD_COLL_REDUCE_SCATTER, dt, n);
                    c.op = cs[k].op;
                    c.in_blocks = (const void *const *)inb;
                    c.in_counts = counts;
                    c.out = out;
                    cc_run(&w, &c, algos[a], "reduce_scatter");
                    /* cc_expected(op, ws, i) is over cc_value(op, r, i); here the index is offset. */
                    for (size_t i = 0; i < n; i++) {
                        size_t gi = (size_t)ctx->rank * n + i;
                        double want = cc_expected(cs[k].op, ws, gi), got = cc_get(dt, out, i);
                        double tol = cs[k].op.kind == TD_AVG ? 1e-9 * (1 + fabs(want)) : 0;
                        TD_CHECK_MSG(fabs(got - want) <= tol, "reduce_scatter %s %s %s%s: element %zu is %g, want %g",
                                     coll_algo_name(algos[a]), td_dtype_name(dt), td_reduce_op_name(cs[k].op.kind),
                                     inplace ? " in place" : "", i, got, want);
                    }
                    if (!inplace)
                        free(out);
                    free(inb);
                    free(flat);
                }
            }
        }
    }
    free(counts);
    cc_world_close(&w);
}

/* ---- all_to_all ------------------------------------------------------------------------------- */

static size_t a2a_count(int src, int dst, size_t base) { return base + (size_t)((src * 2 + dst) % 4); }

CC_COLL_TEST(all_to_all, .timeout_s = 120)
{
    cc_world w = open_cw(ctx);
    int ws = ctx->world_size, me = ctx->rank;
    const td_algo algos[] = {TD_ALGO_PAIRWISE, TD_ALGO_DIRECT, TD_ALGO_AUTO};
    const size_t bases[] = {0, 3, 5000};
    for (size_t a = 0; a < 3; a++) {
        for (size_t b = 0; b < 3; b++) {
            size_t *icount = calloc((size_t)ws, sizeof(size_t)), *ocount = calloc((size_t)ws, sizeof(size_t));
            void **in = calloc((size_t)ws, sizeof(void *)), **out = calloc((size_t)ws, sizeof(void *));
            for (int p = 0; p < ws; p++) {
                icount[p] = a2a_count(me, p, bases[b]);
                ocount[p] = a2a_count(p, me, bases[b]);
                in[p] = calloc(icount[p] + 1, 8);
                out[p] = calloc(ocount[p] + 1, 8);
                for (size_t i = 0; i < icount[p]; i++)
                    ((int64_t *)in[p])[i] = (int64_t)(me * 1000000 + p * 10000) + (int64_t)i;
            }
            td_coll c = cc_coll_of(&w, TD_COLL_ALL_TO_ALL, TD_INT64, 0);
            c.in_blocks = (const void *const *)in;
            c.in_counts = icount;
            c.out_blocks = out;
            c.out_counts = ocount;
            cc_run(&w, &c, algos[a], "all_to_all");
            for (int p = 0; p < ws; p++)
                for (size_t i = 0; i < ocount[p]; i++)
                    TD_CHECK_MSG(((int64_t *)out[p])[i] == (int64_t)(p * 1000000 + me * 10000) + (int64_t)i,
                                 "all_to_all %s: from rank %d element %zu", coll_algo_name(algos[a]), p, i);
            for (int p = 0; p < ws; p++) {
                free(in[p]);
                free(out[p]);
            }
            free(in);
            free(out);
            free(icount);
            free(ocount);
        }
    }
    /* In place: input and output are one buffer, block p for rank p (all_to_all_single on one
     * tensor). Rank q receives rank p's block q into its block p. */
    for (size_t a = 0; a < 3; a++) {
        size_t n = 1001;
        int64_t *flat = calloc(n * (size_t)ws, 8);
        void **b = calloc((size_t)ws, sizeof(void *));
        size_t *counts = calloc((size_t)ws, sizeof(size_t));
        for (int p = 0; p < ws; p++) {
            b[p] = flat + (size_t)p * n;
            counts[p] = n;
            for (size_t i = 0; i < n; i++)
                flat[(size_t)p * n + i] = me * 1000000 + p * 10000 + (int64_t)i;
        }
        td_coll c = cc_coll_of(&w, TD_COLL_ALL_TO_ALL, TD_INT64, 0);
        c.in_blocks = (const void *const *)b;
        c.in_counts = counts;
        c.out_blocks = b;
        c.out_counts = counts;
        cc_run(&w, &c, algos[a], "all_to_all in place");
        for (int p = 0; p < ws; p++)
            for (size_t i = 0; i < n; i++)
                TD_CHECK_MSG(flat[(size_t)p * n + i] == p * 1000000 + me * 10000 + (int64_t)i,
                             "all_to_all %s in place: from rank %d element %zu", coll_algo_name(algos[a]), p, i);
        free(flat);
        free(b);
        free(counts);
    }
    cc_world_close(&w);
}

/* ---- barrier ---------------------------------------------------------------------------------- */

CC_COLL_TEST(barrier)
{
    cc_world w = open_cw(ctx);
    for (int round = 0; round < 3; round++) {
        clock_sleep_ms(30 * ((ctx->rank + round) % ctx->world_size));
        char key[64];
        snprintf(key, sizeof key, "arrived/%d/%d", round, ctx->rank);
        TD_CHECK_OK(td_store_set_str(w.tw.store, key, "1"));
        td_coll c = cc_coll_of(&w, TD_COLL_BARRIER, TD_UINT8, 0);
        cc_run(&w, &c, round == 0 ? TD_ALGO_DISSEMINATION : TD_ALGO_AUTO, "barrier");
        for (int r = 0; r < ctx->world_size; r++) {
            snprintf(key, sizeof key, "arrived/%d/%d", round, r);
            const char *k = key;
            bool ready = false;
            TD_CHECK_OK(td_store_check(w.tw.store, &k, 1, &ready));
            TD_CHECK_MSG(ready, "rank %d left barrier %d before rank %d arrived", ctx->rank, round, r);
        }
    }
    cc_world_close(&w);
}

/* ---- failures --------------------------------------------------------------------------------- */

/* Ranks that disagree on the size fail (no hang): a length mismatch on one side, and the others
 * learn that the group broke. */
TD_TEST(size_disagreement_fails_every_rank, .world_size = 3)
{
    cc_world w = open_cw(ctx);
    size_t n = ctx->rank == 1 ? 5000 : 4000;
    float *buf = calloc(n, sizeof *buf);
    td_coll c = cc_coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, n);
    c.in = c.out = buf;
    int64_t t0 = clock_now_ns();
    td_status s = coll_execute(&w.c, &c, TD_ALGO_RING);
    TD_CHECK_MSG(s == TD_ERR_INVALID || s == TD_ERR_PEER_LOST, "got %s: %s", td_status_str(s), td_last_error());
    TD_CHECK((clock_now_ns() - t0) / 1e9 < 20);
    free(buf);
    cc_world_close(&w);
}

/* A rank that never joins the collective: the others time out at the deadline, and the timeout
 * breaks the group for the latecomer at once. */
TD_TEST(collective_timeout, .world_size = 2)
{
    cc_world w = open_cw(ctx);
    float v = 1;
    td_coll c = cc_coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, 1);
    c.in = c.out = &v;
    if (ctx->rank == 0) {
        c.deadline_ns = clock_now_ns() + 300 * 1000000LL;
        TD_CHECK_ERR(coll_execute(&w.c, &c, TD_ALGO_AUTO), TD_ERR_TIMEOUT, "Timed out waiting for a receive from rank 1");
        TD_CHECK_OK(td_store_set_str(w.tw.store, "timed_out", "1"));
    } else {
        const char *k = "timed_out";
        TD_CHECK_OK(td_store_wait(w.tw.store, &k, 1, 30000));
        /* Another collective than the one rank 0 gave up on (whose data did arrive). */
        c.seq = 99;
        TD_CHECK_ERR(coll_execute(&w.c, &c, TD_ALGO_AUTO), TD_ERR_PEER_LOST, "Connection to rank 0 lost");
    }
    cc_world_close(&w);
}

/* ---- configuration ---------------------------------------------------------------------------- */

TD_TEST(algo_config)
{
    td_coll_config cfg;
    memset(&cfg, 0, sizeof cfg);
    TD_CHECK_OK(coll_config_parse_algo(&cfg, "ring"));
    TD_CHECK_EQ(cfg.forced[TD_COLL_ALL_REDUCE], TD_ALGO_RING);
    TD_CHECK_EQ(cfg.forced[TD_COLL_BROADCAST], TD_ALGO_RING);
    TD_CHECK_EQ(cfg.forced[TD_COLL_ALL_GATHER], TD_ALGO_RING);
    TD_CHECK_EQ(cfg.forced[TD_COLL_REDUCE_SCATTER], TD_ALGO_RING);
    TD_CHECK_EQ(cfg.forced[TD_COLL_GATHER], TD_ALGO_AUTO);
    TD_CHECK_EQ(cfg.forced[TD_COLL_BARRIER], TD_ALGO_AUTO);
    memset(&cfg, 0, sizeof cfg);
    TD_CHECK_OK(coll_config_parse_algo(&cfg, "all_reduce=rhd, broadcast:tree,GATHER=tree"));
    TD_CHECK_EQ(cfg.forced[TD_COLL_ALL_REDUCE], TD_ALGO_RHD);
    TD_CHECK_EQ(cfg.forced[TD_COLL_BROADCAST], TD_ALGO_TREE);
    TD_CHECK_EQ(cfg.forced[TD_COLL_GATHER], TD_ALGO_TREE);
    TD_CHECK_EQ(cfg.forced[TD_COLL_REDUCE], TD_ALGO_AUTO);
    TD_CHECK_ERR(coll_config_parse_algo(&cfg, "fastest"), TD_ERR_INVALID,
                 "TDIST_ALGO: unknown algorithm 'fastest'; choose from auto, rd, ring, rhd, tree, bruck, direct");
    TD_CHECK_ERR(coll_config_parse_algo(&cfg, "all_reduce=bruck"), TD_ERR_INVALID,
                 "TDIST_ALGO: all_reduce has no algorithm 'bruck'; choose from auto, rd, ring, rhd, tree");
    TD_CHECK_ERR(coll_config_parse_algo(&cfg, "allreduce=ring"), TD_ERR_INVALID,
                 "TDIST_ALGO: unknown collective 'allreduce'");
}

/* An unknown TDIST_ALGO fails the tcp group's creation with the same message. */
TD_TEST(algo_env_fails_group_creation, .world_size = 2)
{
    setenv("TDIST_ALGO", "all_reduce=bogus", 1);
    td_store *store = tu_store_open(ctx->store_path);
    td_pg_options o = TD_PG_OPTIONS_INIT;
    o.backend = "tcp";
    o.store = store;
    o.rank = ctx->rank;
    o.world_size = ctx->world_size;
    o.timeout_ms = 30000;
    td_pg *pg = NULL;
    TD_CHECK_ERR(td_pg_create(&o, &pg), TD_ERR_INVALID, "TDIST_ALGO: unknown algorithm 'bogus'");
    unsetenv("TDIST_ALGO");
    tu_store_close(ctx, store, ctx->store_path);
}

/* Forcing through the environment reaches the backend: a group with TDIST_ALGO=rhd still sums. */
TD_TEST(algo_env_forces_backend, .world_size = 3)
{
    setenv("TDIST_ALGO", "rhd", 1);
    td_store *store = tu_store_open(ctx->store_path);
    td_pg_options o = TD_PG_OPTIONS_INIT;
    o.backend = "tcp";
    o.store = store;
    o.rank = ctx->rank;
    o.world_size = ctx->world_size;
    o.timeout_ms = 30000;
    td_pg *pg = NULL;
    TD_CHECK_OK(td_pg_create(&o, &pg));
    unsetenv("TDIST_ALGO");
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT32, TD_SHAPE(100000), ctx->rank + 1.0, &t));
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_SUM, NULL));
    for (int64_t i = 0; i < 100000; i += 997) {
        double v;
        TD_CHECK_OK(td_tensor_get_f64(t, &i, &v));
        TD_CHECK_EQ(v, 6);
    }
    td_tensor_release(t);
    td_pg_destroy(pg);
    tu_store_close(ctx, store, ctx->store_path);
}

TD_TEST_MAIN()
