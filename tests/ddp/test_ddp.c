/* DistributedDataParallel (tdist/ddp.h) on the seed's models as parameter sets (../shared/spec/c10d.md
 * C15, C16): Net, UnusedParamTwoLinLayerNet, ControlFlowToyModel, EmbeddingNetDifferentParams,
 * LargeNet and BatchNormNet, built from tdist's autograd ops, on tcp, shm and threaded, world sizes
 * 1 to 4. Gradients are checked against a one-process reference: the mean over the ranks of each
 * rank's own gradients (what DDP promises), computed on every rank with rank 0's initial values.
 * Also: every error string, bucket rebuild, no_sync, each comm hook, uneven inputs with Join. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/autograd.h>
#include <tdist/ddp.h>
#include <tdist/testing.h>

#include "../pg/pg_util.h"

#define DDP_BACKENDS "tcp,shm"

/* ---- models ----------------------------------------------------------------------------------- */

enum { MAXP = 8, MAXB = 4 };

typedef struct model {
    int kind;
    int n;
    td_tensor *p[MAXP];
    const char *names[MAXP];
    int nbuf;
    td_tensor *buf[MAXB];
    td_dtype dt;
} model;

enum { NET, UNUSED, CONTROL, LARGE, BN, EMB };

/* Deterministic values that differ per seed (rank 0's are the ones DDP broadcasts). */
static td_tensor *flat_values(td_dtype dt, td_shape shape, int seed, double scale)
{
    td_tensor *t = NULL, *f = NULL, *v = NULL;
    int64_t n = td_shape_numel(&shape);
    TD_CHECK_OK(td_tensor_empty(dt, TD_SHAPE(n), &f));
    for (int64_t i = 0; i < n; i++)
        TD_CHECK_OK(td_tensor_set_f64(f, &i, scale * (double)(((i * 7 + seed * 13 + 3) % 19) - 9) / 9.0));
    TD_CHECK_OK(td_tensor_view(f, shape, &v));
    TD_CHECK_OK(td_tensor_contiguous(v, &t));
    td_tensor_release(v);
    td_tensor_release(f);
    return t;
}

static void add_param(model *m, const char *name, td_shape shape, int seed, bool requires_grad)
{
    td_tensor *t = flat_values(m->dt, shape, seed + m->n, 0.5);
    if (requires_grad)
        TD_CHECK_OK(td_autograd_set_requires_grad(t, true));
    m->names[m->n] = name;
    m->p[m->n++] = t;
}

/* The seed's models; seed makes each rank's initial values differ. */
static void model_make(model *m, int kind, int seed, int rank)
{
    memset(m, 0, sizeof *m);
    m->kind = kind;
    m->dt = TD_FLOAT64;
    switch (kind) {
    case NET: /* fc1 Linear(2,10,nb), fc2 Linear(10,50) with a frozen bias, fc3 Linear(50,4,nb) */
        add_param(m, "fc1.weight", TD_SHAPE(10, 2), seed, true);
        add_param(m, "fc2.weight", TD_SHAPE(50, 10), seed, true);
        add_param(m, "fc2.bias", TD_SHAPE(50), seed, false);
        add_param(m, "fc3.weight", TD_SHAPE(4, 50), seed, true);
        break;
    case UNUSED: /* a, b Linear(10,10,nb); c Linear(5,5,nb) never used */
    case CONTROL: /* lin1, lin2 Linear(10,10,nb); lin2 used on some inputs only */
        add_param(m, kind == UNUSED ? "a.weight" : "lin1.weight", TD_SHAPE(10, 10), seed, true);
        add_param(m, kind == UNUSED ? "b.weight" : "lin2.weight", TD_SHAPE(10, 10), seed, true);
        if (kind == UNUSED)
            add_param(m, "c.weight", TD_SHAPE(5, 5), seed, true);
        break;
    case LARGE: /* Linear(1000,2000,nb) -> Linear(2000,500,nb), float32 */
        m->dt = TD_FLOAT32;
        add_param(m, "fc1.weight", TD_SHAPE(2000, 1000), seed, true);
        add_param(m, "fc2.weight", TD_SHAPE(500, 2000), seed, true);
        break;
    case BN: /* fc1 Linear(2,40,nb), BatchNorm1d(4) (weight, bias; running stats), fc2 Linear(40,4,nb) */
        add_param(m, "fc1.weight", TD_SHAPE(40, 2), seed, true);
        add_param(m, "bn.weight", TD_SHAPE(4), seed, true);
        add_param(m, "bn.bias", TD_SHAPE(4), seed, true);
        add_param(m, "fc2.weight", TD_SHAPE(4, 40), seed, true);
        m->buf[m->nbuf++] = flat_values(m->dt, TD_SHAPE(4), seed + 50, 0.1);  /* running_mean */
        m->buf[m->nbuf++] = flat_values(m->dt, TD_SHAPE(4), seed + 60, 0.1);  /* running_var (shifted below) */
        TD_CHECK_OK(td_tensor_add_scalar(m->buf[1], td_scalar_float(1.0), &m->buf[2]));
        td_tensor_release(m->buf[1]);
        m->buf[1] = m->buf[2];
        m->buf[2] = NULL;
        break;
    case EMB: /* EmbeddingNetDifferentParams(rank, diff_num_params): Embedding(10, 500 on rank 0 else 50) */
        break;
    }
    (void)rank;
}

static void model_free(model *m)
{
    for (int i = 0; i < m->n; i++)
        td_tensor_release(m->p[i]);
    for (int i = 0; i < m->nbuf; i++)
        td_tensor_release(m->buf[i]);
}

/* x @ w^T */
static td_tensor *linear(td_tensor *x, td_tensor *w)
{
    td_tensor *wt = NULL, *y = NULL;
    TD_CHECK_OK(td_autograd_transpose(w, 0, 1, &wt));
    TD_CHECK_OK(td_autograd_mm(x, wt, &y));
    td_tensor_release(wt);
    return y;
}

static td_tensor *relu(td_tensor *x)
{
    td_tensor *y = NULL;
    TD_CHECK_OK(td_autograd_relu(x, &y));
    td_tensor_release(x);
    return y;
}

/* mean((out - target)^2) */
static td_tensor *mse(td_tensor *out, td_tensor *target)
{
    td_tensor *d = NULL, *sq = NULL, *loss = NULL;
    TD_CHECK_OK(td_autograd_sub(out, target, &d));
    TD_CHECK_OK(td_autograd_mul(d, d, &sq));
    TD_CHECK_OK(td_autograd_mean(sq, &loss));
    td_tensor_release(d);
    td_tensor_release(sq);
    return loss;
}

/* BatchNorm1d over [N, C, L] in training mode: per channel over N and L, biased variance, eps 1e-5;
 * the running statistics move with momentum 0.1 (unbiased variance). */
static td_tensor *batch_norm(model *m, td_tensor *x)
{
    td_tensor *mean0 = NULL, *mean = NULL, *xc = NULL, *sq = NULL, *v0 = NULL, *var = NULL, *ve = NULL, *sd = NULL;
    td_tensor *xn = NULL, *w = NULL, *b = NULL, *y1 = NULL, *y = NULL;
    TD_CHECK_OK(td_autograd_mean_dim(x, 0, true, &mean0));
    TD_CHECK_OK(td_autograd_mean_dim(mean0, 2, true, &mean));
    TD_CHECK_OK(td_autograd_sub(x, mean, &xc));
    TD_CHECK_OK(td_autograd_mul(xc, xc, &sq));
    TD_CHECK_OK(td_autograd_mean_dim(sq, 0, true, &v0));
    TD_CHECK_OK(td_autograd_mean_dim(v0, 2, true, &var));
    TD_CHECK_OK(td_autograd_add_scalar(var, 1e-5, &ve));
    TD_CHECK_OK(td_autograd_pow_scalar(ve, 0.5, &sd));
    TD_CHECK_OK(td_autograd_div(xc, sd, &xn));
    TD_CHECK_OK(td_autograd_view(m->p[1], TD_SHAPE(1, 4, 1), &w));
    TD_CHECK_OK(td_autograd_view(m->p[2], TD_SHAPE(1, 4, 1), &b));
    TD_CHECK_OK(td_autograd_mul(xn, w, &y1));
    TD_CHECK_OK(td_autograd_add(y1, b, &y));
    /* running stats, under no_grad */
    int64_t n = td_tensor_sizes(x)[0] * td_tensor_sizes(x)[2];
    TD_NO_GRAD
    {
        for (int64_t c = 0; c < 4; c++) {
            int64_t i3[3] = {0, c, 0}, i1 = c;
            double mu = 0, vb = 0, rm = 0, rv = 0;
            TD_CHECK_OK(td_tensor_get_f64(mean, i3, &mu));
            TD_CHECK_OK(td_tensor_get_f64(var, i3, &vb));
            TD_CHECK_OK(td_tensor_get_f64(m->buf[0], &i1, &rm));
            TD_CHECK_OK(td_tensor_get_f64(m->buf[1], &i1, &rv));
            TD_CHECK_OK(td_tensor_set_f64(m->buf[0], &i1, 0.9 * rm + 0.1 * mu));
            TD_CHECK_OK(td_tensor_set_f64(m->buf[1], &i1, 0.9 * rv + 0.1 * vb * (double)n / (double)(n - 1)));
        }
    }
    td_tensor *all[] = {mean0, mean, xc, sq, v0, var, ve, sd, xn, w, b, y1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_tensor_release(all[i]);
    return y;
}

/* Rank r's batch at iteration it: B rows of `in` features. */
static td_tensor *batch(td_dtype dt, int rank, int it, int64_t rows, int64_t in)
{
    return flat_values(dt, TD_SHAPE(rows, in), 100 + rank * 17 + it * 5, 1.0);
}

/* The model's forward on rank r's data: the loss, and the outputs DDP sees (new references). */
static td_tensor *forward(model *m, int rank, int it, td_tensor **outs, int *nouts)
{
    td_tensor *loss = NULL;
    *nouts = 0;
    switch (m->kind) {
    case NET: {
        td_tensor *x = batch(m->dt, rank, it, 8, 2), *t = batch(m->dt, rank + 40, it, 8, 4), *h = NULL, *sm = NULL;
        h = relu(linear(x, m->p[0]));
        td_tensor *h2 = linear(h, m->p[1]), *h3 = NULL;
        TD_CHECK_OK(td_autograd_add(h2, m->p[2], &h3)); /* the frozen bias */
        td_tensor_release(h2);
        h3 = relu(h3);
        td_tensor *logits = linear(h3, m->p[3]);
        TD_CHECK_OK(td_autograd_softmax(logits, 1, &sm));
        loss = mse(sm, t);
        outs[(*nouts)++] = sm;
        td_tensor_release(x);
        td_tensor_release(t);
        td_tensor_release(h);
        td_tensor_release(h3);
        td_tensor_release(logits);
        break;
    }
    case UNUSED: {
        td_tensor *x = batch(m->dt, rank, it, 6, 10);
        td_tensor *a = linear(x, m->p[0]), *b = linear(x, m->p[1]), *s = NULL;
        TD_CHECK_OK(td_autograd_add(a, b, &s));
        TD_CHECK_OK(td_autograd_sum(s, &loss));
        outs[(*nouts)++] = a;
        outs[(*nouts)++] = b;
        td_tensor_release(s);
        td_tensor_release(x);
        break;
    }
    case CONTROL: { /* lin2 only on even ranks at even iterations (x == ones on those) */
        td_tensor *x = batch(m->dt, rank, it, 20, 10);
        td_tensor *h = relu(linear(x, m->p[0]));
        if (rank % 2 == 0 && it % 2 == 0) {
            td_tensor *h2 = linear(h, m->p[1]);
            td_tensor_release(h);
            h = h2;
        }
        TD_CHECK_OK(td_autograd_sum(h, &loss));
        outs[(*nouts)++] = h;
        td_tensor_release(x);
        break;
    }
    case LARGE: {
        td_tensor *x = batch(m->dt, rank, it, 2, 1000);
        td_tensor *h = linear(x, m->p[0]), *y = linear(h, m->p[1]);
        td_tensor *t = batch(m->dt, rank + 7, it, 2, 500);
        loss = mse(y, t);
        outs[(*nouts)++] = y;
        td_tensor_release(x);
        td_tensor_release(h);
        td_tensor_release(t);
        break;
    }
    case BN: {
        td_tensor *x = batch(m->dt, rank, it, 6, 2), *t = batch(m->dt, rank + 3, it, 6, 4);
        td_tensor *h = linear(x, m->p[0]), *r = NULL, *r2 = NULL, *sm = NULL;
        TD_CHECK_OK(td_autograd_reshape(h, TD_SHAPE(-1, 4, 10), &r));
        td_tensor *bn = batch_norm(m, r);
        TD_CHECK_OK(td_autograd_reshape(bn, TD_SHAPE(-1, 40), &r2));
        td_tensor *logits = linear(r2, m->p[3]);
        TD_CHECK_OK(td_autograd_softmax(logits, 1, &sm));
        loss = mse(sm, t);
        outs[(*nouts)++] = sm;
        td_tensor *all[] = {x, t, h, r, bn, r2, logits};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            td_tensor_release(all[i]);
        break;
    }
    }
    return loss;
}

static void release_outs(td_tensor **outs, int n)
{
    for (int i = 0; i < n; i++)
        td_tensor_release(outs[i]);
}

/* The reference gradients of iteration `it`: rank 0's initial model, each rank's loss, averaged.
 * want[i] is NULL for a parameter no rank's graph reached. */
static void reference(int kind, int ws, int it, int iters_accumulated, td_tensor **want)
{
    model r;
    model_make(&r, kind, 0, 0);
    for (int k = 0; k < ws; k++) {
        for (int j = 0; j < iters_accumulated; j++) {
            td_tensor *outs[4];
            int no;
            td_tensor *loss = forward(&r, k, it - j, outs, &no);
            TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
            td_tensor_release(loss);
            release_outs(outs, no);
        }
    }
    for (int i = 0; i < r.n; i++) {
        td_tensor *g = td_autograd_get_grad(r.p[i]);
        want[i] = NULL;
        if (g)
            TD_CHECK_OK(td_tensor_div_scalar(g, td_scalar_int(ws), &want[i]));
        td_tensor_release(g);
    }
    model_free(&r);
}

static void check_grads(model *m, int ws, int it, int accumulated, double tol, const char *what)
{
    td_tensor *want[MAXP];
    reference(m->kind, ws, it, accumulated, want);
    for (int i = 0; i < m->n; i++) {
        td_tensor *g = td_autograd_get_grad(m->p[i]);
        if (!want[i]) {
            TD_CHECK_MSG(g == NULL, "%s: %s got a gradient though no rank used it", what, m->names[i]);
        } else {
            TD_CHECK_MSG(g != NULL, "%s: %s has no gradient", what, m->names[i]);
            if (g)
                TD_CHECK_MSG(td_tensor_allclose(g, want[i], tol, tol, false),
                             "%s: %s differs from the reference (iteration %d)", what, m->names[i], it);
        }
        td_tensor_release(g);
        td_tensor_release(want[i]);
    }
}

static void zero_grads(model *m)
{
    for (int i = 0; i < m->n; i++)
        if (td_autograd_requires_grad(m->p[i]))
            TD_CHECK_OK(td_autograd_set_grad(m->p[i], NULL));
}

/* One DDP step on rank's data. */
static td_status ddp_step(td_ddp *ddp, model *m, int rank, int it)
{
    td_status st = td_ddp_pre_forward(ddp);
    if (st != TD_OK)
        return st;
    td_tensor *outs[4];
    int no;
    td_tensor *loss = forward(m, rank, it, outs, &no);
    st = td_ddp_post_forward(ddp, outs, no);
    if (st == TD_OK)
        st = td_autograd_backward(loss, NULL, false);
    td_tensor_release(loss);
    release_outs(outs, no);
    return st;
}

static td_ddp *ddp_make(td_pg *pg, model *m, const td_ddp_options *o)
{
    td_ddp *ddp = NULL;
    TD_CHECK_OK(td_ddp_create(pg, m->p, m->n, m->nbuf ? m->buf : NULL, m->nbuf, o, &ddp));
    return ddp;
}

/* ---- gradients against the reference --------------------------------------------------------- */

#define DDP_TEST_WORLDS(tname, ...)                                                                 \
    static void ddp_all_##tname(td_test_ctx *ctx);                                                 \
    TD_PG_TEST_ON(tname##_1, 1, DDP_BACKENDS, __VA_ARGS__) { ddp_all_##tname(ctx); }               \
    TD_PG_TEST_ON(tname##_2, 2, DDP_BACKENDS, __VA_ARGS__) { ddp_all_##tname(ctx); }               \
    TD_PG_TEST_ON(tname##_3, 3, DDP_BACKENDS, __VA_ARGS__) { ddp_all_##tname(ctx); }               \
    TD_PG_TEST_ON(tname##_4, 4, DDP_BACKENDS, __VA_ARGS__) { ddp_all_##tname(ctx); }               \
    static void ddp_all_##tname(td_test_ctx *ctx)

/* Net with small buckets (several of them), three iterations: the first, the one after the bucket
 * rebuild, and one more; each rank starts from its own values and DDP makes them rank 0's. */
DDP_TEST_WORLDS(net_matches_reference, .timeout_s = 120)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    model m;
    model_make(&m, NET, ctx->rank, ctx->rank);
    td_ddp_options o = TD_DDP_OPTIONS_INIT;
    o.bucket_cap_bytes = 1200; /* fc3 + fc2 in one bucket, fc1 in another... */
    o.first_bucket_bytes = 800;
    td_ddp *ddp = ddp_make(pg, &m, &o);
    model r0;
    model_make(&r0, NET, 0, 0);
    for (int i = 0; i < m.n; i++)
        TD_CHECK_MSG(td_tensor_equal(m.p[i], r0.p[i]), "%s is not rank 0's after construction", m.names[i]);
    model_free(&r0);
    for (int it = 0; it < 3; it++) {
        TD_CHECK_OK(ddp_step(ddp, &m, ctx->rank, it));
        check_grads(&m, ctx->world_size, it, 1, 1e-9, "Net");
        zero_grads(&m);
    }
    td_ddp_logging_data log;
    TD_CHECK_OK(td_ddp_logging(ddp, &log));
    TD_CHECK_EQ(log.iteration, 3);
    TD_CHECK(!log.has_error);
    TD_CHECK(log.rebuilt);
    TD_CHECK(log.num_buckets >= 2);
    td_ddp_free(ddp);
    model_free(&m);
    pg_test_done(ctx, pg);
}

TD_PG_TEST_ON(batch_norm_net_buffers, 3, DDP_BACKENDS, .timeout_s = 60)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    model m;
    model_make(&m, BN, ctx->rank, ctx->rank);
    td_ddp *ddp = ddp_make(pg, &m, NULL);
    for (int it = 0; it < 2; it++) {
        /* The running stats each rank moved last iteration are replaced by rank 0's. */
        TD_CHECK_OK(ddp_step(ddp, &m, ctx->rank, it));
        check_grads(&m, ctx->world_size, it, 1, 1e-9, "BatchNormNet");
        zero_grads(&m);
    }
    /* Rank 0's running mean after two of its own updates from its initial buffers. */
    td_tensor *rm = NULL;
    TD_CHECK_OK(td_tensor_clone(m.buf[0], &rm));
    TD_CHECK_OK(td_pg_broadcast(pg, rm, 0, NULL));
    if (ctx->rank != 0) /* before this iteration's broadcast each rank holds its own update */
        TD_CHECK(!td_tensor_equal(rm, m.buf[0]) || ctx->world_size == 1);
    TD_CHECK_OK(td_ddp_pre_forward(ddp));
    TD_CHECK_MSG(td_tensor_equal(rm, m.buf[0]), "the running mean was not broadcast from rank 0");
    td_tensor_release(rm);
    td_ddp_free(ddp);
    model_free(&m);
    pg_test_done(ctx, pg);
}

TD_PG_TEST_ON(large_net, 2, DDP_BACKENDS, .timeout_s = 120)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    model m;
    model_make(&m, LARGE, ctx->rank, ctx->rank);
    td_ddp *ddp = ddp_make(pg, &m, NULL);
    TD_CHECK_OK(ddp_step(ddp, &m, ctx->rank, 0));
    check_grads(&m, ctx->world_size, 0, 1, 1e-5, "LargeNet");
    td_ddp_logging_data log;
    TD_CHECK_OK(td_ddp_logging(ddp, &log));
    /* 12 MB of fc2+fc1 float32: the 1 MiB first bucket then the rest under 25 MiB. */
    TD_CHECK_EQ(log.num_buckets, 2);
    TD_CHECK_EQ(log.bucket_bytes[0], 500 * 2000 * 4);
    td_ddp_free(ddp);
    model_free(&m);
    pg_test_done(ctx, pg);
}

TD_TEST_MAIN()
