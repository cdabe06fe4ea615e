/* Test support for the collective tests over transports (coll_check.h): inputs, references and
 * the all_reduce cases that tests/coll and tests/shm share. */
#include "coll_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "tensor/half.h"

/* ---- values ------------------------------------------------------------------------------------- */

double cc_value(td_reduce_op op, int rank, size_t i)
{
    if (op == TD_PRODUCT) {
        static const double t[3] = {1, 2, -1};
        return t[(rank + i) % 3];
    }
    if (op == TD_BAND || op == TD_BOR || op == TD_BXOR)
        return (double)((rank * 37 + i * 11 + 5) & 0xFF);
    return (double)((int)((rank * 7 + i * 3) % 11) - 5);
}

void cc_put(td_dtype dt, void *buf, size_t i, double v)
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

double cc_get(td_dtype dt, const void *buf, size_t i)
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

void *cc_filled(td_dtype dt, td_reduce_op op, int rank, size_t n)
{
    void *b = calloc(n + 1, td_dtype_size(dt));
    for (size_t i = 0; i < n; i++)
        cc_put(dt, b, i, cc_value(op, rank, i));
    return b;
}

double cc_expected(td_op op, int ws, size_t i)
{
    double acc = cc_value(op.kind, 0, i);
    for (int r = 1; r < ws; r++) {
        double v = cc_value(op.kind, r, i);
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
            acc += cc_value(op.kind, r, i) * op.factor;
    }
    return acc;
}

void cc_check_buf(td_dtype dt, td_op op, const void *buf, size_t n, int ws, size_t skip, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double want = cc_expected(op, ws, i + skip), got = cc_get(dt, buf, i);
        double tol = op.kind == TD_AVG ? (dt == TD_BFLOAT16 ? 2e-2 : dt == TD_FLOAT16 ? 2e-3 : 1e-6) * (1 + fabs(want)) : 0;
        if (!(fabs(got - want) <= tol))
            TD_FAIL("%s: element %zu of %zu is %.9g, want %.9g (%s, %s)", what, i, n, got, want, td_dtype_name(dt),
                    td_reduce_op_name(op.kind));
    }
}

uint64_t cc_fnv(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ULL;
    return h;
}

void **cc_blocks(int n, size_t count, td_dtype dt)
{
    void **b = calloc((size_t)n, sizeof *b);
    for (int r = 0; r < n; r++)
        b[r] = calloc(count + 1, td_dtype_size(dt));
    return b;
}

void cc_free_blocks(void **b, int n)
{
    for (int r = 0; r < n; r++)
        free(b[r]);
    free(b);
}

/* ---- a collective world ------------------------------------------------------------------------- */

void cc_world_init(cc_world *w, size_t chunk_bytes, size_t small_bytes, const char *algo, cc_run_fn run)
{
    td_coll_config cfg = {0};
    cfg.chunk_bytes = chunk_bytes;
    cfg.small_bytes = small_bytes;
    if (algo)
        TD_CHECK_OK(coll_config_parse_algo(&cfg, algo));
    TD_CHECK_OK(coll_ctx_init(&w->c, w->tw.t, &cfg));
    w->seq = 0;
    w->run = run;
}

void cc_world_close(cc_world *w)
{
    coll_ctx_free(&w->c);
    tu_world_close(&w->tw);
}

td_coll cc_coll_of(cc_world *w, td_coll_kind kind, td_dtype dt, size_t count)
{
    td_coll c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.dtype = dt;
    c.op = TD_OP_SUM;
    c.count = count;
    c.seq = ++w->seq;
    c.desc = td_coll_desc_make(kind, dt, td_coll_kind_reduces(kind) ? TD_SUM : -1, -1, count, c.seq);
    c.deadline_ns = clock_now_ns() + 60 * 1000000000LL;
    return c;
}

/* A backend sees PREMUL_SUM and AVG only as the SUM the front end resolves them into
 * (tdist/backend.h); runs of the algorithms themselves resolve them the same way around the run. */
static td_status run_resolved(cc_world *w, const td_coll *c, td_algo a)
{
    bool premul = td_coll_kind_reduces(c->kind) && c->op.kind == TD_PREMUL_SUM;
    bool avg = td_coll_kind_reduces(c->kind) && c->op.kind == TD_AVG;
    if (!premul && !avg)
        return w->run(&w->c, c, a);
    td_coll run = *c;
    run.op = TD_OP_SUM;
    char *scaled = NULL;
    const void **blocks = NULL;
    td_status s = TD_OK;
    if (premul && c->count && c->kind == TD_COLL_REDUCE_SCATTER) {
        size_t bytes = c->count * td_dtype_size(c->dtype);
        scaled = malloc(bytes * (size_t)w->c.size);
        blocks = malloc(sizeof *blocks * (size_t)w->c.size);
        for (int r = 0; r < w->c.size && s == TD_OK; r++) {
            blocks[r] = scaled + (size_t)r * bytes;
            s = td_reduce_premul(c->dtype, scaled + (size_t)r * bytes, c->in_blocks[r], c->count, c->op.factor);
        }
        run.in_blocks = blocks;
    } else if (premul && c->count) {
        s = td_reduce_premul(c->dtype, c->out, c->out, c->count, c->op.factor);
    }
    if (s == TD_OK)
        s = w->run(&w->c, &run, a);
    if (s == TD_OK && avg && (c->kind != TD_COLL_REDUCE || w->c.rank == c->root))
        s = td_reduce_finish(TD_AVG, c->dtype, c->out, c->count, w->c.size);
    free(scaled);
    free(blocks);
    return s;
}

void cc_run(cc_world *w, const td_coll *c, td_algo a, const char *what)
{
    td_test_breadcrumb("%s %s n=%zu %s root %d", what, coll_algo_name(a), c->count, td_dtype_name(c->dtype), c->root);
    td_status s = run_resolved(w, c, a);
    if (s != TD_OK)
        TD_FAIL("%s (%s, %zu x %s, op %s, root %d): %s: %s", what, coll_algo_name(a), c->count, td_dtype_name(c->dtype),
                td_reduce_op_name(c->op.kind), c->root, td_status_str(s), td_last_error());
}

/* ---- cases -------------------------------------------------------------------------------------- */

void cc_case_all_reduce(cc_world *w, const td_algo *algos, size_t nalgos, const cc_combo *combos, size_t ncombos,
                        const size_t *sizes, size_t nsizes)
{
    const td_test_ctx *ctx = w->tw.ctx;
    for (size_t a = 0; a < nalgos; a++) {
        for (size_t k = 0; k < ncombos; k++) {
            for (size_t s = 0; s < nsizes; s++) {
                size_t n = sizes[s];
                void *buf = cc_filled(combos[k].dt, combos[k].op.kind, ctx->rank, n);
                td_coll c = cc_coll_of(w, TD_COLL_ALL_REDUCE, combos[k].dt, n);
                c.op = combos[k].op;
                c.in = c.out = buf;
                cc_run(w, &c, algos[a], "all_reduce");
                cc_check_buf(combos[k].dt, combos[k].op, buf, n, ctx->world_size, 0, coll_algo_name(algos[a]));
                free(buf);
            }
        }
    }
}

void cc_case_all_reduce_bit_identical(cc_world *w, const td_algo *algos, size_t nalgos)
{
    const td_test_ctx *ctx = w->tw.ctx;
    const size_t ns[] = {1, 5, 3001, 40009};
    for (size_t a = 0; a < nalgos; a++) {
        for (size_t s = 0; s < sizeof ns / sizeof ns[0]; s++) {
            for (int dti = 0; dti < 3; dti++) {
                td_dtype dt = dti == 0 ? TD_FLOAT32 : dti == 1 ? TD_BFLOAT16 : TD_FLOAT64;
                size_t n = ns[s];
                void *buf = calloc(n, td_dtype_size(dt));
                for (size_t i = 0; i < n; i++)
                    cc_put(dt, buf, i,
                           sin((double)i * 0.37 + ctx->rank * 1.91) * pow(10, (double)((i + ctx->rank) % 9) - 4));
                td_coll c = cc_coll_of(w, TD_COLL_ALL_REDUCE, dt, n);
                c.op = dti == 2 ? TD_OP_AVG : TD_OP_SUM;
                c.in = c.out = buf;
                cc_run(w, &c, algos[a], "all_reduce");
                char key[96], val[32];
                snprintf(key, sizeof key, "hash/%zu/%zu/%d/%d", a, s, dti, ctx->rank);
                snprintf(val, sizeof val, "%016llx", (unsigned long long)cc_fnv(buf, n * td_dtype_size(dt)));
                TD_CHECK_OK(td_store_set_str(w->tw.store, key, val));
                for (int r = 0; r < ctx->world_size; r++) {
                    snprintf(key, sizeof key, "hash/%zu/%zu/%d/%d", a, s, dti, r);
                    void *v = NULL;
                    size_t len = 0;
                    TD_CHECK_OK(td_store_get(w->tw.store, key, &v, &len));
                    TD_CHECK_MSG(len == strlen(val) && memcmp(v, val, len) == 0,
                                 "%s all_reduce of %zu %s: rank %d and rank %d differ", coll_algo_name(algos[a]), n,
                                 td_dtype_name(dt), ctx->rank, r);
                    free(v);
                }
                free(buf);
            }
        }
    }
}
