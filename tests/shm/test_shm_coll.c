/* The shared-memory collectives (src/coll/shm_coll.h) and every transport algorithm of src/coll
 * over the shm transport, between real rank processes, for world sizes 1 to 4: each direct
 * algorithm forced (and the automatic choice), sizes 0, 1, odd, and many times a slot (the slots
 * are cut to 4 KiB so that chunking runs on small data), several dtypes and reduce ops (AVG and
 * PREMUL_SUM included), every root, aliased in-place buffers. Results are checked against
 * references each rank computes locally, and inexact floating-point all_reduce results must be
 * bit-identical on every rank. Also: ranks that disagree about a collective fail at once, a rank
 * killed mid-collective fails the others within 2 s naming it, a stalled rank times out, and four
 * ranks on one core make progress. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "coll/shm_coll.h"
#include "shm_util.h"
#include "tensor/half.h"

#define after_ms shm_test_after_ms
#define since_s shm_test_since_s

typedef struct cw {
    shm_world w;
    td_coll_ctx c;
    uint64_t seq;
} cw;

/* Slots of 4 KiB (the small ones 1 KiB): chunking runs on small data. */
static cw open_cw(td_test_ctx *ctx, const char *algo)
{
    setenv("TDIST_SHM_SLOT", "4K", 1);
    setenv("TDIST_SHM_SMALL", "1K", 1);
    cw w = {0};
    w.w = shm_test_open(ctx, 0);
    unsetenv("TDIST_SHM_SLOT");
    unsetenv("TDIST_SHM_SMALL");
    td_coll_config cfg = {0};
    cfg.chunk_bytes = 4096;
    cfg.small_bytes = 2048;
    if (algo)
        TD_CHECK_OK(td_coll_config_parse_algo(&cfg, algo));
    TD_CHECK_OK(td_coll_ctx_init(&w.c, w.w.t, &cfg));
    return w;
}

static void close_cw(cw *w)
{
    td_coll_ctx_free(&w->c);
    shm_test_close(&w->w);
}

static td_coll coll_of(cw *w, td_coll_kind kind, td_dtype dt, size_t count)
{
    td_coll c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.dtype = dt;
    c.op = TD_OP_SUM;
    c.count = count;
    c.seq = ++w->seq;
    c.deadline_ns = td_now_ns() + 60 * 1000000000LL;
    return c;
}

static void run(cw *w, const td_coll *c, td_algo forced, const char *what)
{
    td_test_breadcrumb("%s %s n=%zu %s root %d", what, td_algo_name(forced), c->count, td_dtype_name(c->dtype), c->root);
    w->c.cfg.forced[c->kind] = forced;
    td_status s = td_shm_coll_run(&w->c, c);
    if (s != TD_OK)
        TD_FAIL("%s (%s, %zu x %s, op %s, root %d): %s: %s", what, td_algo_name(forced), c->count,
                td_dtype_name(c->dtype), td_reduce_op_name(c->op.kind), c->root, td_status_str(s), td_last_error());
}

/* ---- values ----------------------------------------------------------------------------------- */

static double value(td_reduce_op op, int rank, size_t i)
{
    if (op == TD_PRODUCT) {
        static const double t[3] = {1, 2, -1};
        return t[(rank + i) % 3];
    }
    if (op == TD_BAND || op == TD_BOR || op == TD_BXOR)
        return (double)((rank * 37 + i * 11 + 5) & 0xFF);
    return (double)((int)((rank * 7 + i * 3) % 11) - 5);
}

static void put(td_dtype dt, void *buf, size_t i, double v)
{
    switch (dt) {
    case TD_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case TD_FLOAT64: ((double *)buf)[i] = v; break;
    case TD_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case TD_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case TD_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case TD_FLOAT16: ((uint16_t *)buf)[i] = td_float_to_half((float)v); break;
    case TD_BFLOAT16: ((uint16_t *)buf)[i] = td_float_to_bfloat16((float)v); break;
    default: TD_FAIL("dtype %s not used here", td_dtype_name(dt));
    }
}

static double get(td_dtype dt, const void *buf, size_t i)
{
    switch (dt) {
    case TD_FLOAT32: return ((const float *)buf)[i];
    case TD_FLOAT64: return ((const double *)buf)[i];
    case TD_INT32: return ((const int32_t *)buf)[i];
    case TD_INT64: return (double)((const int64_t *)buf)[i];
    case TD_UINT8: return ((const uint8_t *)buf)[i];
    case TD_FLOAT16: return td_half_to_float(((const uint16_t *)buf)[i]);
    case TD_BFLOAT16: return td_bfloat16_to_float(((const uint16_t *)buf)[i]);
    default: TD_FAIL("dtype %s not used here", td_dtype_name(dt));
    }
}

static void *filled(td_dtype dt, td_reduce_op op, int rank, size_t n)
{
    void *b = calloc(n + 1, td_dtype_size(dt));
    for (size_t i = 0; i < n; i++)
        put(dt, b, i, value(op, rank, i));
    return b;
}

static double expected(td_op op, int ws, size_t i)
{
    double acc = value(op.kind, 0, i);
    for (int r = 1; r < ws; r++) {
        double v = value(op.kind, r, i);
        switch (op.kind) {
        case TD_PRODUCT: acc *= v; break;
        case TD_MIN: acc = v < acc ? v : acc; break;
        case TD_MAX: acc = v > acc ? v : acc; break;
        case TD_BAND: acc = (double)((int64_t)acc & (int64_t)v); break;
        case TD_BOR: acc = (double)((int64_t)acc | (int64_t)v); break;
        case TD_BXOR: acc = (double)((int64_t)acc ^ (int64_t)v); break;
        default: acc += v; break;
        }
    }
    if (op.kind == TD_AVG)
        acc /= ws;
    if (op.kind == TD_PREMUL_SUM) {
        acc = 0;
        for (int r = 0; r < ws; r++)
            acc += value(op.kind, r, i) * op.factor;
    }
    return acc;
}

static void check_buf(td_dtype dt, td_op op, const void *buf, size_t n, int ws, size_t skip_block, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double want = expected(op, ws, i + skip_block), got = get(dt, buf, i);
        double tol = op.kind == TD_AVG ? (dt == TD_BFLOAT16 ? 2e-2 : dt == TD_FLOAT16 ? 2e-3 : 1e-6) * (1 + fabs(want)) : 0;
        if (!(fabs(got - want) <= tol))
            TD_FAIL("%s: element %zu of %zu is %.9g, want %.9g (%s, %s)", what, i, n, got, want, td_dtype_name(dt),
                    td_reduce_op_name(op.kind));
    }
}

typedef struct combo {
    td_dtype dt;
    td_op op;
} combo;

static const combo combos[] = {
    {TD_FLOAT32, TD_OP_SUM},  {TD_FLOAT32, TD_OP_MAX}, {TD_FLOAT64, TD_OP_PRODUCT}, {TD_INT32, TD_OP_MIN},
    {TD_INT64, TD_OP_BXOR},   {TD_UINT8, TD_OP_BOR},   {TD_BFLOAT16, TD_OP_SUM},    {TD_FLOAT32, TD_OP_AVG},
    {TD_FLOAT16, TD_OP_AVG},  {TD_FLOAT64, TD_OP_PREMUL_SUM(0.5)}, {TD_INT32, TD_OP_BAND},
};
#define NCOMBOS (sizeof combos / sizeof combos[0])
/* 0, 1, odd, about a small slot, several large slots (4 KiB each). */
static const size_t sizes[] = {0, 1, 7, 250, 1000, 20011};
#define NSIZES (sizeof sizes / sizeof sizes[0])

#define COLL_TEST(name, ...)                                                                   \
    static void body_##name(td_test_ctx *ctx);                                                 \
    TD_TEST(name##_1, .world_size = 1, __VA_ARGS__) { body_##name(ctx); }                      \
    TD_TEST(name##_2, .world_size = 2, __VA_ARGS__) { body_##name(ctx); }                      \
    TD_TEST(name##_3, .world_size = 3, __VA_ARGS__) { body_##name(ctx); }                      \
    TD_TEST(name##_4, .world_size = 4, __VA_ARGS__) { body_##name(ctx); }                      \
    static void body_##name(td_test_ctx *ctx)

/* ---- reductions ------------------------------------------------------------------------------- */

static const td_algo reduce_algos[] = {TD_ALGO_SHM, TD_ALGO_SHM_FLAT, TD_ALGO_AUTO};

COLL_TEST(all_reduce, .timeout_s = 120)
{
    cw w = open_cw(ctx, NULL);
    for (size_t a = 0; a < 3; a++) {
        for (size_t k = 0; k < NCOMBOS; k++) {
            for (size_t s = 0; s < NSIZES; s++) {
                size_t n = sizes[s];
                void *buf = filled(combos[k].dt, combos[k].op.kind, ctx->rank, n);
                td_coll c = coll_of(&w, TD_COLL_ALL_REDUCE, combos[k].dt, n);
                c.op = combos[k].op;
                c.in = c.out = buf;
                run(&w, &c, reduce_algos[a], "all_reduce");
                check_buf(combos[k].dt, combos[k].op, buf, n, ctx->world_size, 0, td_algo_name(reduce_algos[a]));
                free(buf);
            }
        }
    }
    close_cw(&w);
}

COLL_TEST(reduce, .timeout_s = 120)
{
    cw w = open_cw(ctx, NULL);
    for (size_t a = 0; a < 3; a++) {
        for (int root = 0; root < ctx->world_size; root++) {
            for (size_t k = 0; k < NCOMBOS; k += 3) {
                for (size_t s = 0; s < NSIZES; s++) {
                    size_t n = sizes[s];
                    void *buf = filled(combos[k].dt, combos[k].op.kind, ctx->rank, n);
                    td_coll c = coll_of(&w, TD_COLL_REDUCE, combos[k].dt, n);
                    c.op = combos[k].op;
                    c.root = root;
                    c.in = c.out = buf;
                    run(&w, &c, reduce_algos[a], "reduce");
                    if (ctx->rank == root)
                        check_buf(combos[k].dt, combos[k].op, buf, n, ctx->world_size, 0, "reduce");
                    free(buf);
                }
            }
        }
    }
    close_cw(&w);
}

static uint64_t fnv(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ULL;
    return h;
}

/* Inexact sums (values of every magnitude) still give the same bits on every rank. */
COLL_TEST(all_reduce_bit_identical, .timeout_s = 120)
{
    cw w = open_cw(ctx, NULL);
    const size_t ns[] = {1, 5, 3001, 40009};
    for (size_t a = 0; a < 3; a++) {
        for (size_t s = 0; s < sizeof ns / sizeof ns[0]; s++) {
            for (int dti = 0; dti < 3; dti++) {
                td_dtype dt = dti == 0 ? TD_FLOAT32 : dti == 1 ? TD_BFLOAT16 : TD_FLOAT64;
                size_t n = ns[s];
                void *buf = calloc(n, td_dtype_size(dt));
                for (size_t i = 0; i < n; i++)
                    put(dt, buf, i, sin((double)i * 0.37 + ctx->rank * 1.91) * pow(10, (double)((i + ctx->rank) % 9) - 4));
                td_coll c = coll_of(&w, TD_COLL_ALL_REDUCE, dt, n);
                c.op = dti == 2 ? TD_OP_AVG : TD_OP_SUM;
                c.in = c.out = buf;
                run(&w, &c, reduce_algos[a], "all_reduce");
                char key[96], val[32];
                snprintf(key, sizeof key, "hash/%zu/%zu/%d/%d", a, s, dti, ctx->rank);
                snprintf(val, sizeof val, "%016llx", (unsigned long long)fnv(buf, n * td_dtype_size(dt)));
                TD_CHECK_OK(td_store_set_str(w.w.store, key, val));
                for (int r = 0; r < ctx->world_size; r++) {
                    snprintf(key, sizeof key, "hash/%zu/%zu/%d/%d", a, s, dti, r);
                    void *v = NULL;
                    size_t len = 0;
                    TD_CHECK_OK(td_store_get(w.w.store, key, &v, &len));
                    TD_CHECK_MSG(len == strlen(val) && memcmp(v, val, len) == 0,
                                 "%s all_reduce of %zu %s: rank %d and rank %d differ", td_algo_name(reduce_algos[a]),
                                 n, td_dtype_name(dt), ctx->rank, r);
                    free(v);
                }
                free(buf);
            }
        }
    }
    close_cw(&w);
}

static void **blocks(int n, size_t count, td_dtype dt)
{
    void **b = calloc((size_t)n, sizeof *b);
    for (int r = 0; r < n; r++)
        b[r] = calloc(count + 1, td_dtype_size(dt));
    return b;
}

static void free_blocks(void **b, int n)
{
    for (int r = 0; r < n; r++)
        free(b[r]);
    free(b);
}

COLL_TEST(reduce_scatter, .timeout_s = 120)
{
    cw w = open_cw(ctx, NULL);
    int ws = ctx->world_size;
    for (size_t k = 0; k < NCOMBOS; k++) {
        for (size_t s = 0; s < NSIZES; s++) {
            size_t n = sizes[s];
            td_dtype dt = combos[k].dt;
            /* Block r of every rank holds the values of elements r*n .. r*n+n-1. */
            void **in = blocks(ws, n, dt);
            for (int r = 0; r < ws; r++)
                for (size_t i = 0; i < n; i++)
                    put(dt, in[r], i, value(combos[k].op.kind, ctx->rank, (size_t)r * n + i));
            void *out = calloc(n + 1, td_dtype_size(dt));
            td_coll c = coll_of(&w, TD_COLL_REDUCE_SCATTER, dt, n);
            c.op = combos[k].op;
            c.in_blocks = (const void *const *)in;
            c.out = out;
            run(&w, &c, TD_ALGO_SHM, "reduce_scatter");
            check_buf(dt, combos[k].op, out, n, ws, (size_t)ctx->rank * n, "reduce_scatter");
            free(out);
            free_blocks(in, ws);
        }
    }
    close_cw(&w);
}

/* ---- copies ----------------------------------------------------------------------------------- */

COLL_TEST(copies, .timeout_s = 120)
{
    cw w = open_cw(ctx, NULL);
    int ws = ctx->world_size, me = ctx->rank;
    for (size_t s = 0; s < NSIZES; s++) {
        size_t n = sizes[s];
        for (int root = 0; root < ws; root++) {
            float *buf = filled(TD_FLOAT32, TD_SUM, me, n);
            td_coll c = coll_of(&w, TD_COLL_BROADCAST, TD_FLOAT32, n);
            c.root = root;
            c.in = c.out = buf;
            run(&w, &c, TD_ALGO_SHM, "broadcast");
            for (size_t i = 0; i < n; i++)
                TD_CHECK_MSG(buf[i] == (float)value(TD_SUM, root, i), "broadcast from %d: element %zu", root, i);
            free(buf);

            /* gather to root, scatter from root */
            float *in = filled(TD_FLOAT32, TD_SUM, me, n);
            void **out = blocks(ws, n, TD_FLOAT32);
            c = coll_of(&w, TD_COLL_GATHER, TD_FLOAT32, n);
            c.root = root;
            c.in = in;
            c.out_blocks = me == root ? out : NULL;
            run(&w, &c, TD_ALGO_SHM, "gather");
            if (me == root)
                for (int r = 0; r < ws; r++)
                    for (size_t i = 0; i < n; i++)
                        TD_CHECK_MSG(((float *)out[r])[i] == (float)value(TD_SUM, r, i), "gather: rank %d element %zu", r,
                                     i);
            void **sin = blocks(ws, n, TD_FLOAT32);
            for (int r = 0; r < ws; r++)
                for (size_t i = 0; i < n; i++)
                    ((float *)sin[r])[i] = (float)value(TD_SUM, r + 7, i);
            float *sout = calloc(n + 1, sizeof(float));
            c = coll_of(&w, TD_COLL_SCATTER, TD_FLOAT32, n);
            c.root = root;
            c.in_blocks = me == root ? (const void *const *)sin : NULL;
            c.out = sout;
            run(&w, &c, TD_ALGO_SHM, "scatter");
            for (size_t i = 0; i < n; i++)
                TD_CHECK_MSG(sout[i] == (float)value(TD_SUM, me + 7, i), "scatter from %d: element %zu", root, i);
            free(sout);
            free_blocks(sin, ws);
            free_blocks(out, ws);
            free(in);
        }
        /* all_gather, in place: rank r's input is its own output block */
        void **out = blocks(ws, n, TD_FLOAT64);
        for (size_t i = 0; i < n; i++)
            ((double *)out[me])[i] = value(TD_SUM, me, i);
        td_coll c = coll_of(&w, TD_COLL_ALL_GATHER, TD_FLOAT64, n);
        c.in = out[me];
        c.out_blocks = out;
        run(&w, &c, TD_ALGO_SHM, "all_gather");
        for (int r = 0; r < ws; r++)
            for (size_t i = 0; i < n; i++)
                TD_CHECK_MSG(((double *)out[r])[i] == value(TD_SUM, r, i), "all_gather: rank %d element %zu", r, i);
        free_blocks(out, ws);
        c = coll_of(&w, TD_COLL_BARRIER, TD_FLOAT32, 0);
        run(&w, &c, TD_ALGO_SHM, "barrier");
    }
    close_cw(&w);
}

/* ---- every transport algorithm over the shm transport ----------------------------------------- */

COLL_TEST(transport_algorithms, .timeout_s = 120)
{
    cw w = open_cw(ctx, NULL);
    int ws = ctx->world_size, me = ctx->rank;
    const td_algo ar[] = {TD_ALGO_RD, TD_ALGO_RING, TD_ALGO_RHD, TD_ALGO_TREE};
    const size_t ns[] = {0, 1, 7, 20011};
    for (size_t s = 0; s < 4; s++) {
        size_t n = ns[s];
        for (size_t a = 0; a < 4; a++) {
            void *buf = filled(TD_INT32, TD_SUM, me, n);
            td_coll c = coll_of(&w, TD_COLL_ALL_REDUCE, TD_INT32, n);
            c.in = c.out = buf;
            run(&w, &c, ar[a], "all_reduce");
            check_buf(TD_INT32, TD_OP_SUM, buf, n, ws, 0, td_algo_name(ar[a]));
            free(buf);
        }
        for (int chain = 0; chain < 2; chain++) {
            float *buf = filled(TD_FLOAT32, TD_SUM, me, n);
            td_coll c = coll_of(&w, TD_COLL_BROADCAST, TD_FLOAT32, n);
            c.root = ws - 1;
            c.in = c.out = buf;
            run(&w, &c, chain ? TD_ALGO_RING : TD_ALGO_TREE, "broadcast");
            for (size_t i = 0; i < n; i++)
                TD_CHECK(buf[i] == (float)value(TD_SUM, ws - 1, i));
            free(buf);
        }
        for (int bruck = 0; bruck < 2; bruck++) {
            void **out = blocks(ws, n, TD_INT64);
            void *in = filled(TD_INT64, TD_SUM, me, n);
            td_coll c = coll_of(&w, TD_COLL_ALL_GATHER, TD_INT64, n);
            c.in = in;
            c.out_blocks = out;
            run(&w, &c, bruck ? TD_ALGO_BRUCK : TD_ALGO_RING, "all_gather");
            for (int r = 0; r < ws; r++)
                for (size_t i = 0; i < n; i++)
                    TD_CHECK(((int64_t *)out[r])[i] == (int64_t)value(TD_SUM, r, i));
            free(in);
            free_blocks(out, ws);
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
            td_coll c = coll_of(&w, TD_COLL_ALL_TO_ALL, TD_INT32, 0);
            c.in_blocks = (const void *const *)in;
            c.in_counts = ic;
            c.out_blocks = out;
            c.out_counts = oc;
            run(&w, &c, direct ? TD_ALGO_DIRECT : TD_ALGO_PAIRWISE, "all_to_all");
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
        td_coll c = coll_of(&w, TD_COLL_BARRIER, TD_FLOAT32, 0);
        run(&w, &c, TD_ALGO_DISSEMINATION, "barrier");
    }
    close_cw(&w);
}

/* Eight ranks (on a machine with fewer cores): every direct algorithm still gives the right
 * result. */
TD_TEST(eight_ranks, .world_size = 8, .timeout_s = 120)
{
    cw w = open_cw(ctx, NULL);
    const size_t ns[] = {1, 100, 5000};
    for (size_t s = 0; s < 3; s++) {
        size_t n = ns[s];
        for (size_t a = 0; a < 2; a++) {
            void *buf = filled(TD_FLOAT64, TD_SUM, ctx->rank, n);
            td_coll c = coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT64, n);
            c.in = c.out = buf;
            run(&w, &c, reduce_algos[a], "all_reduce");
            check_buf(TD_FLOAT64, TD_OP_SUM, buf, n, 8, 0, td_algo_name(reduce_algos[a]));
            free(buf);
        }
        void **out = blocks(8, n, TD_INT32);
        void *in = filled(TD_INT32, TD_SUM, ctx->rank, n);
        td_coll c = coll_of(&w, TD_COLL_ALL_GATHER, TD_INT32, n);
        c.in = in;
        c.out_blocks = out;
        run(&w, &c, TD_ALGO_SHM, "all_gather");
        for (int r = 0; r < 8; r++)
            for (size_t i = 0; i < n; i++)
                TD_CHECK(((int32_t *)out[r])[i] == (int32_t)value(TD_SUM, r, i));
        free(in);
        free_blocks(out, 8);
    }
    close_cw(&w);
}

/* ---- failures --------------------------------------------------------------------------------- */

/* Ranks that run different collectives (here: different sizes) fail at once on every rank with a
 * message that names both, instead of mixing their data. */
TD_TEST(disagreement_fails_every_rank, .world_size = 3, .timeout_s = 60)
{
    cw w = open_cw(ctx, NULL);
    size_t n = ctx->rank == 1 ? 100 : 200;
    float *buf = filled(TD_FLOAT32, TD_SUM, ctx->rank, n);
    td_coll c = coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, n);
    c.in = c.out = buf;
    w.c.cfg.forced[TD_COLL_ALL_REDUCE] = TD_ALGO_SHM;
    int64_t t0 = td_now_ns();
    TD_CHECK_ERR(td_shm_coll_run(&w.c, &c), TD_ERR_INVALID, "Ranks disagree about a collective");
    TD_CHECK_CONTAINS(td_last_error(), "all_reduce of 100 float32 elements");
    TD_CHECK(since_s(t0) < 10);
    free(buf);
    shm_test_barrier(ctx, w.w.store, "done");
    close_cw(&w);
}

/* Rank 2 dies (SIGKILL) while the others are inside a direct all_reduce, waiting for it: both fail
 * within 2 s with TD_ERR_PEER_LOST naming rank 2, the next collective fails the same way, and no
 * segment is left in /dev/shm. */
TD_TEST(peer_killed_mid_collective, .world_size = 3, .skip_return_code_check = true, .allow_leftovers = true,
        .timeout_s = 60)
{
    cw w = open_cw(ctx, NULL);
    size_t n = 100000; /* many slots */
    float *buf = filled(TD_FLOAT32, TD_SUM, ctx->rank, n);
    td_coll c = coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, n);
    c.in = c.out = buf;
    run(&w, &c, TD_ALGO_AUTO, "all_reduce");
    if (ctx->rank == 2) {
        td_sleep_ms(300);
        raise(SIGKILL);
    }
    c = coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, n);
    c.in = c.out = buf;
    int64_t t0 = td_now_ns();
    TD_CHECK_ERR(td_shm_coll_run(&w.c, &c), TD_ERR_PEER_LOST, "Connection to rank 2 lost");
    double dt = since_s(t0);
    TD_CHECK_MSG(dt < 2.3, "the loss of rank 2 took %.2f s to notice (the kill came at 0.3 s)", dt);
    c = coll_of(&w, TD_COLL_BROADCAST, TD_FLOAT32, 4);
    c.in = c.out = buf;
    TD_CHECK_ERR(td_shm_coll_run(&w.c, &c), TD_ERR_PEER_LOST, "Connection to rank 2 lost");
    shm_test_no_segments();
    free(buf);
    w.w.keep_store = true;
    close_cw(&w);
}

/* A rank that stalls: the waiting rank fails at its deadline, and the stalled one at once when it
 * comes (the abort was relayed). */
TD_TEST(stalled_rank_times_out, .world_size = 2, .timeout_s = 60)
{
    cw w = open_cw(ctx, NULL);
    float v = 1;
    td_coll c = coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, 1);
    c.in = c.out = &v;
    if (ctx->rank == 0) {
        c.deadline_ns = td_now_ns() + 300 * 1000000LL;
        int64_t t0 = td_now_ns();
        TD_CHECK_ERR(td_shm_coll_run(&w.c, &c), TD_ERR_TIMEOUT, "waiting for rank 1 in a shared-memory collective");
        TD_CHECK(since_s(t0) >= 0.29 && since_s(t0) < 10);
        TD_CHECK_OK(td_store_set_str(w.w.store, "timed_out", "1"));
    } else {
        const char *k = "timed_out";
        TD_CHECK_OK(td_store_wait(w.w.store, &k, 1, 30000));
        /* The relayed abort reaches this rank's transport (a receive fails with it), and every
         * collective after it fails the same way. */
        char b[4];
        TD_CHECK_ERR(td_transport_recv(w.w.t, 0, 1, b, 4, after_ms(30000)), TD_ERR_TIMEOUT, "waiting for rank 1");
        TD_CHECK_ERR(td_shm_coll_run(&w.c, &c), TD_ERR_TIMEOUT, "waiting for rank 1");
    }
    close_cw(&w);
}

/* Four ranks on one core: a thousand small all_reduces and some large ones still go through. */
TD_TEST(four_ranks_one_core, .world_size = 4, .timeout_s = 120)
{
    shm_test_one_core();
    cw w = open_cw(ctx, NULL);
    int64_t t0 = td_now_ns();
    float v[2];
    for (int i = 0; i < 1000; i++) {
        v[0] = (float)ctx->rank;
        v[1] = 1;
        td_coll c = coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, 2);
        c.in = c.out = v;
        run(&w, &c, TD_ALGO_AUTO, "all_reduce");
        TD_CHECK(v[0] == 6 && v[1] == 4);
    }
    size_t n = 50000;
    for (int i = 0; i < 5; i++) {
        float *buf = filled(TD_FLOAT32, TD_SUM, ctx->rank, n);
        td_coll c = coll_of(&w, TD_COLL_ALL_REDUCE, TD_FLOAT32, n);
        c.in = c.out = buf;
        run(&w, &c, TD_ALGO_AUTO, "all_reduce");
        check_buf(TD_FLOAT32, TD_OP_SUM, buf, n, 4, 0, "all_reduce");
        free(buf);
    }
    double dt = since_s(t0);
    TD_CHECK_MSG(dt < 60, "4 ranks on one core took %.1f s", dt);
    shm_test_barrier(ctx, w.w.store, "done");
    close_cw(&w);
}

TD_TEST_MAIN()
