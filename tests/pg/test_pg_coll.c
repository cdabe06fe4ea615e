/* Every collective and p2p call of tdist/pg.h, on every backend (pg_util.h), for world sizes 1 to
 * 4: representative dtypes, every reduce op, sizes 0, 1 and odd, non-contiguous arguments, and the
 * values each rank must end with, computed independently from pg_test_value. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pg_util.h"

/* ---- all_reduce: every dtype x every op ------------------------------------------------------ */

typedef struct exp_arg {
    td_dtype dt;
    td_op op;
    int ws;
} exp_arg;

static double expected_at(void *p, int64_t i)
{
    exp_arg *a = p;
    return pg_test_expected(a->dt, a->op, a->ws, i);
}

static const td_reduce_op all_ops[] = {TD_SUM, TD_PRODUCT, TD_MIN, TD_MAX, TD_BAND, TD_BOR, TD_BXOR, TD_AVG, TD_PREMUL_SUM};

static td_op op_for(td_reduce_op k) { return k == TD_PREMUL_SUM ? TD_OP_PREMUL_SUM(0.5) : td_op_of(k); }

static void check_all_reduce(td_test_ctx *ctx, td_pg *pg, td_dtype dt, td_op op, int64_t n, bool strided)
{
    td_tensor *t = strided ? pg_test_strided(dt, ctx->rank, n) : pg_test_tensor(dt, ctx->rank, n);
    td_test_breadcrumb("all_reduce %s %s n=%lld%s", td_dtype_name(dt), td_reduce_op_name(op.kind), (long long)n,
                       strided ? " strided" : "");
    TD_CHECK_OK(td_pg_all_reduce(pg, t, op, NULL));
    exp_arg a = {dt, op, ctx->world_size};
    pg_test_check_values(t, expected_at, &a, "all_reduce");
    if (td_dtype_is_complex(dt)) {
        double im = ctx->world_size * (ctx->world_size - 1) / 2.0;
        if (op.kind == TD_AVG)
            im /= ctx->world_size;
        if (op.kind == TD_PREMUL_SUM)
            im *= op.factor;
        for (int64_t i = 0; i < n; i++)
            TD_CHECK_NEAR(pg_test_get_imag(t, i), im, 1e-4);
    }
    if (strided) { /* the elements between the view's must be untouched */
        td_tensor *base = NULL;
        TD_CHECK_OK(td_tensor_from_storage(td_tensor_storage(t), 0, dt, TD_SHAPE(2 * n), NULL, &base));
        for (int64_t i = 1; i < 2 * n; i += 2)
            TD_CHECK_NEAR(pg_test_get(base, i), dt == TD_BOOL ? 1 : 5, 0);
        td_tensor_release(base);
    }
    td_tensor_release(t);
}

TD_PG_TEST_WORLDS(all_reduce_dtypes_ops, .timeout_s = 120)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    for (int d = 0; d < PG_NDTYPES; d++) {
        td_dtype dt = pg_test_dtypes[d];
        for (size_t k = 0; k < sizeof all_ops / sizeof all_ops[0]; k++) {
            td_op op = op_for(all_ops[k]);
            if (td_pg_supports(pg, "all_reduce", dt, op.kind) != TD_OK) {
                /* Unsupported pairs fail on the caller, before anything is sent. */
                td_tensor *t = pg_test_tensor(dt, ctx->rank, 3);
                TD_CHECK_ERR(td_pg_all_reduce(pg, t, op, NULL), TD_ERR_INVALID, NULL);
                td_tensor_release(t);
                continue;
            }
            check_all_reduce(ctx, pg, dt, op, 1023, false);
            check_all_reduce(ctx, pg, dt, op, 7, true);
        }
        check_all_reduce(ctx, pg, dt, TD_OP_SUM, 0, false);
        check_all_reduce(ctx, pg, dt, TD_OP_SUM, 1, false);
    }
    /* A 0-dim tensor and a 2-D transposed one. */
    td_tensor *s = NULL;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT64, TD_SHAPE_SCALAR, ctx->rank + 1.0, &s));
    TD_CHECK_OK(td_pg_all_reduce(pg, s, TD_OP_SUM, NULL));
    double v;
    TD_CHECK_OK(td_tensor_get_f64(s, NULL, &v));
    TD_CHECK_NEAR(v, ctx->world_size * (ctx->world_size + 1) / 2.0, 0);
    td_tensor_release(s);
    td_tensor *m = NULL, *mt = NULL;
    TD_CHECK_OK(td_tensor_arange(TD_INT32, 0, 6, 1, &m));
    TD_CHECK_OK(td_tensor_view(m, TD_SHAPE(2, 3), &mt));
    td_tensor_release(m);
    TD_CHECK_OK(td_tensor_transpose(mt, 0, 1, &m));
    TD_CHECK(!td_tensor_is_contiguous(m));
    TD_CHECK_OK(td_pg_all_reduce(pg, m, TD_OP_SUM, NULL));
    for (int64_t i = 0; i < 3; i++)
        for (int64_t j = 0; j < 2; j++) {
            int64_t idx[2] = {i, j}, got;
            TD_CHECK_OK(td_tensor_get_i64(m, idx, &got));
            TD_CHECK_EQ(got, (j * 3 + i) * ctx->world_size);
        }
    td_tensor_release(m);
    td_tensor_release(mt);
    pg_test_done(ctx, pg);
}

/* ---- the other collectives ------------------------------------------------------------------- */

/* Element i of rank r's data in the collective tests: distinct per rank and index. */
static double rv(int r, int64_t i) { return r * 100.0 + (double)i; }

static td_tensor *ranked(td_dtype dt, int r, int64_t n, bool strided, int64_t offset)
{
    td_tensor *t = strided ? pg_test_strided(dt, 0, n) : pg_test_tensor(dt, 0, n);
    for (int64_t i = 0; i < n; i++)
        TD_CHECK_OK(td_tensor_set_f64(t, &i, rv(r, i + offset)));
    return t;
}

static void check_ranked(const td_tensor *t, int r, int64_t offset, const char *what)
{
    for (int64_t i = 0; i < td_tensor_numel(t); i++)
        if (pg_test_get(t, i) != rv(r, i + offset))
            TD_FAIL("%s: element %lld is %g, expected %g (rank %d's)", what, (long long)i, pg_test_get(t, i),
                    rv(r, i + offset), r);
}

static void zero(td_tensor *t) { TD_CHECK_OK(td_tensor_fill(t, 0)); }

static void test_broadcast_reduce(td_test_ctx *ctx, td_pg *pg)
{
    int ws = ctx->world_size, me = ctx->rank;
    for (int root = 0; root < ws; root++) {
        td_tensor *t = ranked(TD_INT64, me, 1023, false, 0);
        TD_CHECK_OK(td_pg_broadcast(pg, t, root, NULL));
        check_ranked(t, root, 0, "broadcast");
        td_tensor_release(t);
        t = ranked(TD_FLOAT16, me, 5, true, 0);
        TD_CHECK_OK(td_pg_broadcast(pg, t, root, NULL));
        check_ranked(t, root, 0, "broadcast strided f16");
        td_tensor_release(t);

        /* reduce: the root gets the sum, the others keep their values. */
        t = ranked(TD_FLOAT64, me, 33, root % 2 == 1, 0);
        TD_CHECK_OK(td_pg_reduce(pg, t, root, TD_OP_SUM, NULL));
        for (int64_t i = 0; i < 33; i++) {
            double want = 0;
            for (int r = 0; r < ws; r++)
                want += rv(r, i);
            TD_CHECK_NEAR(pg_test_get(t, i), me == root ? want : rv(me, i), 0);
        }
        td_tensor_release(t);
        t = ranked(TD_INT32, me, 9, false, 0);
        TD_CHECK_OK(td_pg_reduce(pg, t, root, TD_OP_MAX, NULL));
        check_ranked(t, me == root ? ws - 1 : me, 0, "reduce max");
        td_tensor_release(t);
    }
}

static void test_gathers(td_test_ctx *ctx, td_pg *pg)
{
    int ws = ctx->world_size, me = ctx->rank;
    td_tensor **outs = calloc((size_t)ws, sizeof *outs);
    /* all_gather into a list, some outputs non-contiguous, and an odd size. */
    td_tensor *in = ranked(TD_FLOAT32, me, 1023, false, 0);
    for (int r = 0; r < ws; r++)
        outs[r] = r % 2 ? pg_test_strided(TD_FLOAT32, 0, 1023) : pg_test_tensor(TD_FLOAT32, 0, 1023);
    TD_CHECK_OK(td_pg_all_gather(pg, outs, in, NULL));
    for (int r = 0; r < ws; r++) {
        check_ranked(outs[r], r, 0, "all_gather");
        td_tensor_release(outs[r]);
    }
    td_tensor_release(in);

    /* all_gather_into_tensor, with a strided input, and in place (the input is the output's chunk). */
    in = pg_test_strided(TD_UINT8, 0, 6);
    for (int64_t i = 0; i < 6; i++)
        TD_CHECK_OK(td_tensor_set_f64(in, &i, (double)(me * 10 + i)));
    td_tensor *out = NULL;
    TD_CHECK_OK(td_tensor_zeros(TD_UINT8, TD_SHAPE(ws, 6), &out));
    TD_CHECK_OK(td_pg_all_gather_into_tensor(pg, out, in, NULL));
    for (int r = 0; r < ws; r++)
        for (int64_t i = 0; i < 6; i++) {
            int64_t idx[2] = {r, i}, got;
            TD_CHECK_OK(td_tensor_get_i64(out, idx, &got));
            TD_CHECK_EQ(got, r * 10 + i);
        }
    td_tensor_release(in);
    td_tensor *chunk = NULL;
    zero(out);
    TD_CHECK_OK(td_tensor_select(out, 0, me, &chunk));
    TD_CHECK_OK(td_tensor_fill(chunk, me + 1));
    TD_CHECK_OK(td_pg_all_gather_into_tensor(pg, out, chunk, NULL));
    for (int r = 0; r < ws; r++)
        for (int64_t i = 0; i < 6; i++) {
            int64_t idx[2] = {r, i}, got;
            TD_CHECK_OK(td_tensor_get_i64(out, idx, &got));
            TD_CHECK_EQ(got, r + 1);
        }
    td_tensor_release(chunk);
    td_tensor_release(out);

    /* all_gather_coalesced: two inputs of different sizes and shapes. */
    td_tensor *ins[2] = {ranked(TD_INT64, me, 3, false, 0), NULL};
    td_tensor *m = ranked(TD_INT64, me, 4, false, 50);
    TD_CHECK_OK(td_tensor_view(m, TD_SHAPE(2, 2), &ins[1]));
    td_tensor_release(m);
    td_tensor **couts = calloc((size_t)ws * 2, sizeof *couts);
    for (int r = 0; r < ws; r++) {
        couts[2 * r] = pg_test_strided(TD_INT64, 0, 3);
        TD_CHECK_OK(td_tensor_zeros(TD_INT64, TD_SHAPE(2, 2), &couts[2 * r + 1]));
    }
    TD_CHECK_OK(td_pg_all_gather_coalesced(pg, couts, ins, 2, NULL));
    for (int r = 0; r < ws; r++) {
        check_ranked(couts[2 * r], r, 0, "all_gather_coalesced[0]");
        td_tensor *flat = NULL;
        TD_CHECK_OK(td_tensor_flatten(couts[2 * r + 1], &flat));
        check_ranked(flat, r, 50, "all_gather_coalesced[1]");
        td_tensor_release(flat);
        td_tensor_release(couts[2 * r]);
        td_tensor_release(couts[2 * r + 1]);
    }
    free(couts);
    td_tensor_release(ins[0]);
    td_tensor_release(ins[1]);

    /* gather to every root. */
    for (int root = 0; root < ws; root++) {
        in = ranked(TD_FLOAT16, me, 17, root % 2 == 0, 0);
        for (int r = 0; r < ws; r++)
            outs[r] = pg_test_tensor(TD_FLOAT16, 0, 17);
        TD_CHECK_OK(td_pg_gather(pg, me == root ? outs : NULL, in, root, NULL));
        for (int r = 0; r < ws; r++) {
            if (me == root)
                check_ranked(outs[r], r, 0, "gather");
            td_tensor_release(outs[r]);
        }
        td_tensor_release(in);
    }
    free(outs);
}

static void test_scatters(td_test_ctx *ctx, td_pg *pg)
{
    int ws = ctx->world_size, me = ctx->rank;
    td_tensor **ins = calloc((size_t)ws, sizeof *ins);
    for (int root = 0; root < ws; root++) {
        for (int r = 0; r < ws; r++)
            ins[r] = ranked(TD_INT32, r, 11, r % 2 == 1, 0);
        td_tensor *out = pg_test_strided(TD_INT32, 0, 11);
        TD_CHECK_OK(td_pg_scatter(pg, out, me == root ? ins : NULL, root, NULL));
        check_ranked(out, me, 0, "scatter");
        td_tensor_release(out);
        for (int r = 0; r < ws; r++)
            td_tensor_release(ins[r]);
    }

    /* reduce_scatter: rank r gets the sum over ranks of everyone's block r. */
    for (int r = 0; r < ws; r++)
        ins[r] = ranked(TD_FLOAT64, me, 5, r == 0, r * 1000);
    td_tensor *out = pg_test_tensor(TD_FLOAT64, 0, 5);
    TD_CHECK_OK(td_pg_reduce_scatter(pg, out, ins, TD_OP_SUM, NULL));
    for (int64_t i = 0; i < 5; i++) {
        double want = 0;
        for (int q = 0; q < ws; q++)
            want += rv(q, i + me * 1000);
        TD_CHECK_NEAR(pg_test_get(out, i), want, 0);
    }
    TD_CHECK_OK(td_pg_reduce_scatter(pg, out, ins, TD_OP_AVG, NULL));
    for (int64_t i = 0; i < 5; i++) {
        double want = 0;
        for (int q = 0; q < ws; q++)
            want += rv(q, i + me * 1000);
        TD_CHECK_NEAR(pg_test_get(out, i), want / ws, 1e-9);
    }
    for (int r = 0; r < ws; r++)
        td_tensor_release(ins[r]);
    td_tensor_release(out);
    free(ins);

    /* reduce_scatter_tensor with PREMUL_SUM, and in place (the output is the input's chunk). */
    td_tensor *in = NULL, *chunk = NULL;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT32, TD_SHAPE(ws, 3), me + 1.0, &in));
    out = pg_test_tensor(TD_FLOAT32, 0, 3);
    TD_CHECK_OK(td_pg_reduce_scatter_tensor(pg, out, in, TD_OP_PREMUL_SUM(2.0), NULL));
    for (int64_t i = 0; i < 3; i++)
        TD_CHECK_NEAR(pg_test_get(out, i), ws * (ws + 1.0), 0);
    TD_CHECK_OK(td_tensor_select(in, 0, me, &chunk));
    TD_CHECK_OK(td_pg_reduce_scatter_tensor(pg, chunk, in, TD_OP_MIN, NULL));
    for (int64_t i = 0; i < 3; i++)
        TD_CHECK_NEAR(pg_test_get(chunk, i), 1.0, 0);
    td_tensor_release(chunk);
    td_tensor_release(in);
    td_tensor_release(out);
}

static void test_all_to_all(td_test_ctx *ctx, td_pg *pg)
{
    int ws = ctx->world_size, me = ctx->rank;
    /* List form with uneven sizes: rank r sends (r + q + 1) elements to rank q. */
    td_tensor **ins = calloc((size_t)ws, sizeof *ins), **outs = calloc((size_t)ws, sizeof *outs);
    for (int q = 0; q < ws; q++) {
        ins[q] = ranked(TD_INT64, me, me + q + 1, q % 2 == 1, q * 10);
        outs[q] = q % 2 == 0 ? pg_test_strided(TD_INT64, 0, q + me + 1) : pg_test_tensor(TD_INT64, 0, q + me + 1);
    }
    TD_CHECK_OK(td_pg_all_to_all(pg, outs, ins, NULL));
    for (int q = 0; q < ws; q++) {
        check_ranked(outs[q], q, me * 10, "all_to_all");
        td_tensor_release(ins[q]);
        td_tensor_release(outs[q]);
    }
    free(ins);
    free(outs);

    /* all_to_all_single, equal splits of a [ws * 2, 3] tensor, in place. */
    td_tensor *t = NULL, *flat = NULL;
    TD_CHECK_OK(td_tensor_empty(TD_FLOAT64, TD_SHAPE(ws * 2, 3), &t));
    TD_CHECK_OK(td_tensor_flatten(t, &flat));
    for (int64_t i = 0; i < ws * 6; i++)
        TD_CHECK_OK(td_tensor_set_f64(flat, &i, rv(me, i)));
    TD_CHECK_OK(td_pg_all_to_all_single(pg, t, t, NULL, NULL, NULL));
    for (int q = 0; q < ws; q++)
        for (int64_t i = 0; i < 6; i++)
            TD_CHECK_NEAR(pg_test_get(flat, q * 6 + i), rv(q, me * 6 + i), 0);
    td_tensor_release(flat);
    td_tensor_release(t);

    /* With splits: rank r sends q + 1 rows to rank q, and so receives me + 1 rows from each. */
    int64_t *in_splits = calloc((size_t)ws, sizeof(int64_t)), *out_splits = calloc((size_t)ws, sizeof(int64_t));
    int64_t in_rows = 0;
    for (int q = 0; q < ws; q++) {
        in_splits[q] = q + 1;
        out_splits[q] = me + 1;
        in_rows += q + 1;
    }
    td_tensor *in = NULL, *out = NULL;
    TD_CHECK_OK(td_tensor_empty(TD_INT32, TD_SHAPE(in_rows, 2), &in));
    TD_CHECK_OK(td_tensor_zeros(TD_INT32, TD_SHAPE((int64_t)ws * (me + 1), 2), &out));
    TD_CHECK_OK(td_tensor_flatten(in, &flat));
    for (int64_t i = 0; i < in_rows * 2; i++)
        TD_CHECK_OK(td_tensor_set_f64(flat, &i, rv(me, i)));
    td_tensor_release(flat);
    TD_CHECK_OK(td_pg_all_to_all_single(pg, out, in, out_splits, in_splits, NULL));
    TD_CHECK_OK(td_tensor_flatten(out, &flat));
    /* Rank q's rows for me start at row sum_{k < me} (k + 1) = me (me + 1) / 2. */
    for (int q = 0; q < ws; q++)
        for (int64_t i = 0; i < (me + 1) * 2; i++)
            TD_CHECK_NEAR(pg_test_get(flat, q * (me + 1) * 2 + i), rv(q, me * (me + 1) + i), 0);
    td_tensor_release(flat);
    td_tensor_release(in);
    td_tensor_release(out);
    free(in_splits);
    free(out_splits);
}

static void test_coalesced_and_barrier(td_test_ctx *ctx, td_pg *pg)
{
    int ws = ctx->world_size, me = ctx->rank;
    td_tensor *ts[3] = {ranked(TD_FLOAT32, me, 4, false, 0), ranked(TD_FLOAT32, me, 3, true, 10), NULL};
    td_tensor *m = ranked(TD_FLOAT32, me, 6, false, 20);
    TD_CHECK_OK(td_tensor_view(m, TD_SHAPE(3, 2), &ts[2]));
    td_tensor_release(m);
    TD_CHECK_OK(td_pg_all_reduce_coalesced(pg, ts, 3, TD_OP_SUM, NULL));
    int64_t offs[3] = {0, 10, 20};
    for (int k = 0; k < 3; k++) {
        td_tensor *flat = NULL;
        TD_CHECK_OK(td_tensor_flatten(ts[k], &flat));
        for (int64_t i = 0; i < td_tensor_numel(flat); i++) {
            double want = 0;
            for (int r = 0; r < ws; r++)
                want += rv(r, i + offs[k]);
            TD_CHECK_NEAR(pg_test_get(flat, i), want, 0);
        }
        td_tensor_release(flat);
        td_tensor_release(ts[k]);
    }
    for (int i = 0; i < 3; i++)
        TD_CHECK_OK(td_pg_barrier(pg, NULL));
}

TD_PG_TEST_WORLDS(collectives, .timeout_s = 120)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    test_broadcast_reduce(ctx, pg);
    test_gathers(ctx, pg);
    test_scatters(ctx, pg);
    test_all_to_all(ctx, pg);
    test_coalesced_and_barrier(ctx, pg);
    pg_test_done(ctx, pg);
}

/* ---- point to point -------------------------------------------------------------------------- */

static void p2p_body(td_test_ctx *ctx)
{
    int ws = ctx->world_size, me = ctx->rank, next = (me + 1) % ws, prev = (me + ws - 1) % ws;
    td_pg *pg = pg_test_init(ctx, NULL);
    /* A ring: isend to next, blocking recv from prev, with two tags whose messages must not mix. */
    td_tensor *a = ranked(TD_FLOAT64, me, 1023, false, 0), *b = ranked(TD_FLOAT64, me, 5, true, 7);
    td_future *fa = NULL, *fb = NULL;
    TD_CHECK_OK(td_pg_send(pg, b, next, 2, &fb));
    TD_CHECK_OK(td_pg_send(pg, a, next, 1, &fa));
    td_tensor *ra = pg_test_tensor(TD_FLOAT64, 0, 1023), *rb = pg_test_strided(TD_FLOAT64, 0, 5);
    int sender = -1;
    TD_CHECK_OK(td_pg_recv(pg, ra, prev, 1, &sender, NULL));
    TD_CHECK_EQ(sender, prev);
    TD_CHECK_OK(td_pg_recv(pg, rb, prev, 2, NULL, NULL));
    check_ranked(ra, prev, 0, "recv tag 1");
    check_ranked(rb, prev, 7, "recv tag 2");
    TD_CHECK_OK(td_future_wait(fa, 0));
    TD_CHECK_OK(td_future_wait(fb, 0));
    td_future_release(fa);
    td_future_release(fb);

    /* Receives from any source: rank 0 collects one message from everyone, learning the senders. */
    td_tensor *one = ranked(TD_INT32, me, 1, false, 0);
    if (me == 0) {
        int seen = 0;
        for (int k = 1; k < ws; k++) {
            td_future *f = NULL;
            TD_CHECK_OK(td_pg_recv(pg, one, TD_ANY_SOURCE, 9, NULL, &f));
            TD_CHECK_OK(td_future_wait(f, 0));
            td_value *v = td_future_value(f);
            TD_CHECK(v && td_value_kind_of(v) == TD_VAL_INT);
            int src = (int)td_value_get_int(v);
            TD_CHECK(src >= 1 && src < ws);
            TD_CHECK_EQ(pg_test_get(one, 0), rv(src, 0));
            seen |= 1 << src;
            td_future_release(f);
        }
        TD_CHECK_EQ(seen, (1 << ws) - 2);
    } else {
        TD_CHECK_OK(td_pg_send(pg, one, 0, 9, NULL));
    }
    td_tensor_release(one);

    /* batch_isend_irecv: exchange with both neighbours at once; an empty message too. */
    td_tensor *to_next = ranked(TD_INT64, me, 3, false, 0), *to_prev = ranked(TD_INT64, me, 4, false, 0);
    td_tensor *from_prev = pg_test_tensor(TD_INT64, 0, 3), *from_next = pg_test_tensor(TD_INT64, 0, 4);
    td_tensor *empty_out = pg_test_tensor(TD_INT64, me, 0), *empty_in = pg_test_tensor(TD_INT64, 0, 0);
    td_p2p_op ops[6] = {
        {true, to_next, next, 3}, {true, to_prev, prev, 4},  {false, from_prev, prev, 3},
        {false, from_next, next, 4}, {true, empty_out, next, 5}, {false, empty_in, prev, 5},
    };
    td_future *works[6];
    TD_CHECK_OK(td_pg_batch_isend_irecv(pg, ops, 6, works));
    TD_CHECK_OK(td_future_wait_all(works, 6, 30000));
    for (int i = 0; i < 6; i++)
        td_future_release(works[i]);
    if (ws > 1) {
        check_ranked(from_prev, prev, 0, "batch from prev");
        check_ranked(from_next, next, 0, "batch from next");
    }
    td_tensor *all[] = {to_next, to_prev, from_prev, from_next, empty_out, empty_in, a, b, ra, rb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_tensor_release(all[i]);
    pg_test_done(ctx, pg);
}

TD_PG_TEST(p2p_2, 2, .timeout_s = 60) { p2p_body(ctx); }
TD_PG_TEST(p2p_3, 3, .timeout_s = 60) { p2p_body(ctx); }
TD_PG_TEST(p2p_4, 4, .timeout_s = 60) { p2p_body(ctx); }

/* ---- object collectives ---------------------------------------------------------------------- */

/* spec C11's COLLECTIVES_OBJECT_TEST_LIST, as td_values. */
static td_value *object_list(void)
{
    td_value *l = td_value_list_new();
    td_value *d = td_value_dict_new(), *nested = td_value_dict_new();
    td_value_dict_set_str(nested, "nested", td_value_bool(true));
    td_value_dict_set_str(d, "key1", td_value_int(3));
    td_value_dict_set_str(d, "key2", td_value_int(4));
    td_value_dict_set_str(d, "key3", nested);
    td_value_list_append(l, d);
    td_value_list_append(l, td_value_record_of(TD_REC_USER, 2, td_value_int(10), td_value_int(1)));
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_arange(TD_FLOAT32, 0, 9, 1, &t));
    td_value_list_append(l, td_value_record_of(TD_REC_USER, 1, td_value_tensor(t)));
    td_tensor_release(t);
    td_value_list_append(l, td_value_string("foo"));
    td_value *inner = td_value_list_new();
    td_value_list_append(inner, td_value_int(4));
    td_value_list_append(inner, td_value_int(5));
    td_value_list_append(inner, td_value_string("nested"));
    td_value *outer = td_value_list_new();
    td_value_list_append(outer, td_value_int(1));
    td_value_list_append(outer, td_value_int(2));
    td_value_list_append(outer, td_value_bool(true));
    td_value_list_append(outer, td_value_string("string"));
    td_value_list_append(outer, inner);
    td_value_list_append(l, outer);
    return l;
}

/* A per-rank object whose size differs by rank (so padding matters). */
static td_value *rank_object(int r)
{
    td_value *v = td_value_list_new();
    td_value_list_append(v, td_value_int(r));
    for (int i = 0; i < r; i++)
        td_value_list_append(v, td_value_string("padding"));
    return v;
}

TD_PG_TEST_WORLDS(object_collectives, .timeout_s = 60)
{
    int ws = ctx->world_size, me = ctx->rank;
    td_pg *pg = pg_test_init(ctx, NULL);

    td_value *mine = rank_object(me), *all = NULL;
    TD_CHECK_OK(td_pg_all_gather_object(pg, mine, &all));
    TD_CHECK_EQ(td_value_len(all), ws);
    for (int r = 0; r < ws; r++) {
        td_value *want = rank_object(r);
        TD_CHECK(td_value_equal(td_value_at(all, (size_t)r), want));
        td_value_release(want);
    }
    td_value_release(all);

    for (int dst = 0; dst < ws; dst++) {
        td_value *got = NULL;
        TD_CHECK_OK(td_pg_gather_object(pg, mine, me == dst ? &got : NULL, dst));
        if (me == dst) {
            TD_CHECK_EQ(td_value_len(got), ws);
            for (int r = 0; r < ws; r++)
                TD_CHECK_EQ(td_value_get_int(td_value_at(td_value_at(got, (size_t)r), 0)), r);
            td_value_release(got);
        }
    }

    td_value *want = object_list();
    for (int src = 0; src < ws; src++) {
        td_value *l;
        if (me == src) {
            l = object_list();
        } else {
            l = td_value_list_new();
            for (int i = 0; i < 5; i++)
                td_value_list_append(l, td_value_none());
        }
        TD_CHECK_OK(td_pg_broadcast_object_list(pg, l, src));
        TD_CHECK(td_value_equal(l, want));
        td_value_release(l);
    }
    td_value_release(want);

    for (int src = 0; src < ws; src++) {
        td_value *in = NULL, *got = NULL;
        if (me == src) {
            in = td_value_list_new();
            for (int r = 0; r < ws; r++)
                td_value_list_append(in, rank_object(r * 2));
        }
        TD_CHECK_OK(td_pg_scatter_object_list(pg, &got, in, src));
        td_value *expect = rank_object(me * 2);
        TD_CHECK(td_value_equal(got, expect));
        td_value_release(expect);
        td_value_release(got);
        td_value_release(in);
    }
    td_value_release(mine);
    pg_test_done(ctx, pg);
}

/* ---- asynchronous operations overlapping ------------------------------------------------------ */

static void count_cb(td_future *f, void *arg)
{
    (void)f;
    __atomic_add_fetch((int *)arg, 1, __ATOMIC_SEQ_CST);
}

static td_status numel_of_first(td_future *parent, void *arg, td_value **result)
{
    (void)arg;
    if (td_future_status(parent) != TD_OK)
        return td_future_status(parent);
    td_value *l = td_future_value(parent);
    *result = td_value_int(td_tensor_numel(td_value_get_tensor(td_value_at(l, 0))));
    return TD_OK;
}

static void async_body(td_test_ctx *ctx)
{
    int ws = ctx->world_size, me = ctx->rank;
    td_pg *pg = pg_test_init(ctx, NULL);
    enum { N = 8 };
    td_tensor *ts[N];
    td_future *fs[N + 3];
    int callbacks = 0;
    for (int k = 0; k < N; k++) {
        ts[k] = ranked(TD_FLOAT32, me, 100 + k, k % 3 == 0, k);
        TD_CHECK_OK(td_pg_all_reduce(pg, ts[k], TD_OP_SUM, &fs[k]));
        td_future_add_callback(fs[k], count_cb, &callbacks);
    }
    td_tensor *bc = ranked(TD_INT64, me, 10, false, 0);
    TD_CHECK_OK(td_pg_broadcast(pg, bc, ws - 1, &fs[N]));
    td_tensor **outs = calloc((size_t)ws, sizeof *outs);
    for (int r = 0; r < ws; r++)
        outs[r] = pg_test_tensor(TD_INT32, 0, 3);
    td_tensor *in = ranked(TD_INT32, me, 3, false, 0);
    TD_CHECK_OK(td_pg_all_gather(pg, outs, in, &fs[N + 1]));
    TD_CHECK_OK(td_pg_barrier(pg, &fs[N + 2]));
    td_future *chained = td_future_then(fs[0], numel_of_first, NULL);
    TD_CHECK_OK(td_future_wait_all(fs, N + 3, 60000));
    for (int k = 0; k < N; k++) {
        TD_CHECK(td_future_is_completed(fs[k]));
        td_value *v = td_future_value(fs[k]);
        TD_CHECK(v && td_value_len(v) == 1 && td_value_get_tensor(td_value_at(v, 0)) == ts[k]);
        for (int64_t i = 0; i < 100 + k; i++) {
            double want = 0;
            for (int r = 0; r < ws; r++)
                want += rv(r, i + k);
            TD_CHECK_NEAR(pg_test_get(ts[k], i), want, 1e-3 * want);
        }
    }
    check_ranked(bc, ws - 1, 0, "async broadcast");
    for (int r = 0; r < ws; r++)
        check_ranked(outs[r], r, 0, "async all_gather");
    TD_CHECK_OK(td_future_wait(chained, 10000));
    TD_CHECK_EQ(td_value_get_int(td_future_value(chained)), 100);
    td_future_release(chained);
    /* Callbacks run on the executor after completion: wait for them with a generous bound. */
    for (int spin = 0; spin < 10000 && __atomic_load_n(&callbacks, __ATOMIC_SEQ_CST) < N; spin++) {
        struct timespec ts1 = {0, 1000000};
        nanosleep(&ts1, NULL);
    }
    TD_CHECK_EQ(__atomic_load_n(&callbacks, __ATOMIC_SEQ_CST), N);
    for (int k = 0; k < N + 3; k++)
        td_future_release(fs[k]);
    for (int k = 0; k < N; k++)
        td_tensor_release(ts[k]);
    for (int r = 0; r < ws; r++)
        td_tensor_release(outs[r]);
    free(outs);
    td_tensor_release(in);
    td_tensor_release(bc);
    pg_test_done(ctx, pg);
}

TD_PG_TEST(async_overlap_2, 2, .timeout_s = 60) { async_body(ctx); }
TD_PG_TEST(async_overlap_4, 4, .timeout_s = 60) { async_body(ctx); }

/* ---- one large all_reduce (tcp only: it measures the transport, not a memcpy) ---------------- */

static void large_body(td_test_ctx *ctx)
{
    int64_t n = (64LL << 20) / 4; /* 64 MiB of float32 */
    td_pg *pg = pg_test_init(ctx, NULL);
    td_tensor *t = pg_test_tensor(TD_FLOAT32, ctx->rank, n);
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_SUM, NULL));
    const float *p = td_tensor_data(t);
    for (int64_t i = 0; i < n; i++) {
        double want = pg_test_expected(TD_FLOAT32, TD_OP_SUM, ctx->world_size, i);
        if (p[i] != (float)want)
            TD_FAIL("element %lld is %g, expected %g", (long long)i, (double)p[i], want);
    }
    td_tensor_release(t);
    pg_test_done(ctx, pg);
}

TD_TEST(all_reduce_64mib_2, .world_size = 2, .params = TD_PG_PROCESS_BACKENDS, .static_skip = pg_test_skip_unavailable,
        .setup = pg_test_setup,
        .timeout_s = 240)
{
    large_body(ctx);
}

TD_TEST(all_reduce_64mib_4, .world_size = 4, .params = TD_PG_PROCESS_BACKENDS, .static_skip = pg_test_skip_unavailable,
        .setup = pg_test_setup,
        .timeout_s = 240)
{
    large_body(ctx);
}

TD_TEST_MAIN()
