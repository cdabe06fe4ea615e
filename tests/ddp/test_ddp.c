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
static void reference_over(int kind, const int *ranks, int nranks, int it, int iters_accumulated, td_tensor **want)
{
    model r;
    model_make(&r, kind, 0, 0);
    for (int q = 0; q < nranks; q++) {
        int k = ranks[q];
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
            TD_CHECK_OK(td_tensor_div_scalar(g, td_scalar_int(nranks), &want[i]));
        td_tensor_release(g);
    }
    model_free(&r);
}

static void reference(int kind, int ws, int it, int iters_accumulated, td_tensor **want)
{
    int ranks[8];
    for (int k = 0; k < ws; k++)
        ranks[k] = k;
    reference_over(kind, ranks, ws, it, iters_accumulated, want);
}

static void check_grads_over(model *m, const int *ranks, int nranks, int it, double tol, const char *what)
{
    td_tensor *want[MAXP];
    reference_over(m->kind, ranks, nranks, it, 1, want);
    for (int i = 0; i < m->n; i++) {
        td_tensor *g = td_autograd_get_grad(m->p[i]);
        if (want[i])
            TD_CHECK_MSG(g && td_tensor_allclose(g, want[i], tol, tol, false),
                         "%s: %s differs from the reference (iteration %d)", what, m->names[i], it);
        td_tensor_release(g);
        td_tensor_release(want[i]);
    }
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

/* A case's group, model (kind, from this rank's own initial values) and DDP over them. */
static td_pg *setup(td_test_ctx *ctx, int kind, const td_ddp_options *o, model *m, td_ddp **ddp)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    model_make(m, kind, ctx->rank, ctx->rank);
    *ddp = ddp_make(pg, m, o);
    return pg;
}

static void teardown(td_test_ctx *ctx, td_pg *pg, model *m, td_ddp *ddp)
{
    td_ddp_free(ddp);
    model_free(m);
    pg_test_done(ctx, pg);
}

/* iters DDP steps from iteration `first`, each checked against the reference and its gradients
 * cleared. */
static void steps_checked(td_ddp *ddp, model *m, int rank, int ws, int first, int iters, double tol, const char *what)
{
    for (int it = first; it < first + iters; it++) {
        TD_CHECK_OK(ddp_step(ddp, m, rank, it));
        check_grads(m, ws, it, 1, tol, what);
        zero_grads(m);
    }
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
    td_ddp_options o = TD_DDP_OPTIONS_INIT;
    o.bucket_cap_bytes = 1200; /* fc3 + fc2 in one bucket, fc1 in another... */
    o.first_bucket_bytes = 800;
    model m;
    td_ddp *ddp = NULL;
    td_pg *pg = setup(ctx, NET, &o, &m, &ddp);
    model r0;
    model_make(&r0, NET, 0, 0);
    for (int i = 0; i < m.n; i++)
        TD_CHECK_MSG(td_tensor_equal(m.p[i], r0.p[i]), "%s is not rank 0's after construction", m.names[i]);
    model_free(&r0);
    steps_checked(ddp, &m, ctx->rank, ctx->world_size, 0, 3, 1e-9, "Net");
    td_ddp_logging_data log;
    TD_CHECK_OK(td_ddp_logging(ddp, &log));
    TD_CHECK_EQ(log.iteration, 3);
    TD_CHECK(!log.has_error);
    TD_CHECK(log.rebuilt);
    TD_CHECK(log.num_buckets >= 2);
    teardown(ctx, pg, &m, ddp);
}

TD_PG_TEST_ON(batch_norm_net_buffers, 3, DDP_BACKENDS, .timeout_s = 60)
{
    model m;
    td_ddp *ddp = NULL;
    td_pg *pg = setup(ctx, BN, NULL, &m, &ddp);
    /* Each forward first replaces the running stats every rank moved by rank 0's. */
    steps_checked(ddp, &m, ctx->rank, ctx->world_size, 0, 2, 1e-9, "BatchNormNet");
    /* Rank 0's running mean after two of its own updates from its initial buffers. */
    td_tensor *rm = NULL;
    TD_CHECK_OK(td_tensor_clone(m.buf[0], &rm));
    TD_CHECK_OK(td_pg_broadcast(pg, rm, 0, NULL));
    if (ctx->rank != 0) /* before this iteration's broadcast each rank holds its own update */
        TD_CHECK(!td_tensor_equal(rm, m.buf[0]) || ctx->world_size == 1);
    TD_CHECK_OK(td_ddp_pre_forward(ddp));
    TD_CHECK_MSG(td_tensor_equal(rm, m.buf[0]), "the running mean was not broadcast from rank 0");
    td_tensor_release(rm);
    teardown(ctx, pg, &m, ddp);
}

TD_PG_TEST_ON(large_net, 2, DDP_BACKENDS, .timeout_s = 120)
{
    model m;
    td_ddp *ddp = NULL;
    td_pg *pg = setup(ctx, LARGE, NULL, &m, &ddp);
    TD_CHECK_OK(ddp_step(ddp, &m, ctx->rank, 0));
    check_grads(&m, ctx->world_size, 0, 1, 1e-5, "LargeNet");
    td_ddp_logging_data log;
    TD_CHECK_OK(td_ddp_logging(ddp, &log));
    /* 12 MB of fc2+fc1 float32: the 1 MiB first bucket then the rest under 25 MiB. */
    TD_CHECK_EQ(log.num_buckets, 2);
    TD_CHECK_EQ(log.bucket_bytes[0], 500 * 2000 * 4);
    teardown(ctx, pg, &m, ddp);
}

/* ---- unused parameters and the unfinished-reduction error ------------------------------------ */

static const char *const unfinished = "Expected to have finished reduction in the prior iteration";
static const char *const recommend = "passing the keyword argument `find_unused_parameters=True`";
static const char *const enabled = "Since `find_unused_parameters=True` is enabled";
static const char *const outputs_in_loss = "`forward` function outputs participate in calculating loss";
static const char *const suggest_debug = "set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL";

/* UnusedParamTwoLinLayerNet: c never gets a gradient, so without find_unused_parameters the first
 * backward leaves its bucket unreduced and the next step fails, on every rank. */
TD_PG_TEST_ON(unused_param_error, 2, DDP_BACKENDS, .timeout_s = 60)
{
    td_ddp_options o = TD_DDP_OPTIONS_INIT;
    o.bucket_cap_bytes = o.first_bucket_bytes = 1; /* one parameter per bucket: a and b still reduce */
    model m;
    td_ddp *ddp = NULL;
    td_pg *pg = setup(ctx, UNUSED, &o, &m, &ddp);
    TD_CHECK_OK(ddp_step(ddp, &m, ctx->rank, 0));
    td_status st = td_ddp_pre_forward(ddp);
    TD_CHECK_EQ(st, TD_ERR_INVALID);
    TD_CHECK_CONTAINS(td_last_error(), unfinished);
    TD_CHECK_CONTAINS(td_last_error(), recommend);
    TD_CHECK_CONTAINS(td_last_error(), outputs_in_loss);
    TD_CHECK_CONTAINS(td_last_error(), suggest_debug);
    TD_CHECK(strstr(td_last_error(), enabled) == NULL);
    td_ddp_logging_data log;
    TD_CHECK_OK(td_ddp_logging(ddp, &log));
    TD_CHECK(log.has_error);
    TD_CHECK_CONTAINS(log.error, unfinished);
    TD_CHECK_EQ(log.iteration, 0);
    teardown(ctx, pg, &m, ddp);
}

/* Under DETAIL the error names the parameters; under INFO their indices. */
TD_PG_TEST_ON(unused_param_error_detail, 2, DDP_BACKENDS, .timeout_s = 60)
{
    for (int level = 0; level < 2; level++) {
        pg_test_opts po = {.debug_level = level ? "DETAIL" : "INFO",
                           .init_url = level ? pg_test_url(ctx, "detail") : pg_test_url(ctx, "info")};
        td_pg *pg = pg_test_init(ctx, &po);
        model m;
        model_make(&m, UNUSED, ctx->rank, ctx->rank);
        const char *names[] = {"a.weight", "b.weight", "c.weight"};
        td_ddp_options o = TD_DDP_OPTIONS_INIT;
        o.param_names = names;
        td_ddp *ddp = ddp_make(pg, &m, &o);
        TD_CHECK_OK(ddp_step(ddp, &m, ctx->rank, 0));
        TD_CHECK_ERR(td_ddp_post_forward(ddp, NULL, 0), TD_ERR_INVALID, unfinished);
        char want[128];
        snprintf(want, sizeof want, "Parameter indices which did not receive grad for rank %d: 2", ctx->rank);
        TD_CHECK_CONTAINS(td_last_error(), want);
        snprintf(want, sizeof want, "Parameters which did not receive grad for rank %d: c.weight", ctx->rank);
        if (level)
            TD_CHECK_CONTAINS(td_last_error(), want);
        else
            TD_CHECK(strstr(td_last_error(), "Parameters which did not") == NULL);
        TD_CHECK(strstr(td_last_error(), suggest_debug) == NULL);
        td_ddp_free(ddp);
        model_free(&m);
        pg_test_done(ctx, pg);
    }
}

/* find_unused_parameters: c is found unreached and the step completes; c.grad stays unset. A loss
 * that ignores one of the outputs (b) leaves b unreduced, and the error says the flag is on. */
TD_PG_TEST_ON(find_unused_parameters, 3, DDP_BACKENDS, .timeout_s = 60)
{
    td_ddp_options o = TD_DDP_OPTIONS_INIT;
    o.find_unused_parameters = true;
    model m;
    td_ddp *ddp = NULL;
    td_pg *pg = setup(ctx, UNUSED, &o, &m, &ddp);
    steps_checked(ddp, &m, ctx->rank, ctx->world_size, 0, 2, 1e-9, "UnusedParamTwoLinLayerNet");
    /* Outputs (a, b), loss from a alone. */
    TD_CHECK_OK(td_ddp_pre_forward(ddp));
    td_tensor *x = batch(m.dt, ctx->rank, 0, 6, 10), *a = linear(x, m.p[0]), *b = linear(x, m.p[1]), *loss = NULL;
    td_tensor *outs[] = {a, b};
    TD_CHECK_OK(td_autograd_sum(a, &loss));
    TD_CHECK_OK(td_ddp_post_forward(ddp, outs, 2));
    TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
    TD_CHECK_ERR(td_ddp_pre_forward(ddp), TD_ERR_INVALID, unfinished);
    TD_CHECK_CONTAINS(td_last_error(), enabled);
    TD_CHECK_CONTAINS(td_last_error(), outputs_in_loss);
    td_tensor *all[] = {x, a, b, loss};
    for (size_t i = 0; i < 4; i++)
        td_tensor_release(all[i]);
    teardown(ctx, pg, &m, ddp);
}

/* ControlFlowToyModel: lin2 is used on even ranks at even iterations only, so it is locally unused
 * on some ranks and globally unused at odd iterations (its .grad is then left unset). */
DDP_TEST_WORLDS(control_flow_unused, .timeout_s = 60)
{
    td_ddp_options o = TD_DDP_OPTIONS_INIT;
    o.find_unused_parameters = true;
    model m;
    td_ddp *ddp = NULL;
    td_pg *pg = setup(ctx, CONTROL, &o, &m, &ddp);
    steps_checked(ddp, &m, ctx->rank, ctx->world_size, 0, 4, 1e-9, "ControlFlowToyModel");
    teardown(ctx, pg, &m, ddp);
}

/* EmbeddingNetDifferentParams: a different parameter count on rank 1, then different shapes. */
TD_PG_TEST_ON(model_differs_across_ranks, 2, DDP_BACKENDS, .timeout_s = 60)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    /* diff_num_params on rank 1: Embedding(10, 500), Linear(500, 1), and lin2 Linear(1, 1, nb). */
    model m = {.dt = TD_FLOAT64};
    add_param(&m, "embedding.weight", TD_SHAPE(10, 500), 0, true);
    add_param(&m, "lin.weight", TD_SHAPE(1, 500), 0, true);
    add_param(&m, "lin.bias", TD_SHAPE(1), 0, true);
    if (ctx->rank == 1)
        add_param(&m, "lin2.weight", TD_SHAPE(1, 1), 0, true);
    td_ddp *ddp = NULL;
    char want[160];
    snprintf(want, sizeof want, "DDP expects same model across all ranks, but Rank %d has %d params, while rank %d has "
             "inconsistent %d params.", ctx->rank, m.n, 1 - ctx->rank, ctx->rank ? 3 : 4);
    TD_CHECK_ERR(td_ddp_create(pg, m.p, m.n, NULL, 0, NULL, &ddp), TD_ERR_INVALID, want);
    TD_CHECK(ddp == NULL);
    model_free(&m);
    /* Embedding(10, 500 if rank == 0 else 50) -> Linear(dim, 1). */
    int dim = ctx->rank == 0 ? 500 : 50;
    model e = {.dt = TD_FLOAT64};
    add_param(&e, "embedding.weight", TD_SHAPE(10, dim), 0, true);
    add_param(&e, "lin.weight", TD_SHAPE(1, dim), 0, true);
    add_param(&e, "lin.bias", TD_SHAPE(1), 0, true);
    td_status st = td_ddp_create(pg, e.p, e.n, NULL, 0, NULL, &ddp);
    if (ctx->rank == 0) /* rank 0 matches itself, and fails too, naming the rank that differs */
        TD_CHECK_ERR(st, TD_ERR_INVALID, "[0]: params[0] in process 1 with sizes [10, 50] appears not to match "
                                         "sizes of the same param in process 0.");
    else
        TD_CHECK_ERR(st, TD_ERR_INVALID, "[1]: params[0] in this process with sizes [10, 50] appears not to match "
                                         "sizes of the same param in process 0.");
    model_free(&e);
    pg_test_done(ctx, pg);
}

/* ---- no_sync, gradient_as_bucket_view, comm hooks -------------------------------------------- */

/* Two iterations under no_sync accumulate locally; the third reduces all three. */
TD_PG_TEST_ON(no_sync_accumulates, 3, DDP_BACKENDS, .timeout_s = 60)
{
    model m;
    td_ddp *ddp = NULL;
    td_pg *pg = setup(ctx, NET, NULL, &m, &ddp);
    TD_CHECK_OK(td_ddp_set_require_sync(ddp, false));
    TD_CHECK_OK(ddp_step(ddp, &m, ctx->rank, 0));
    TD_CHECK_OK(ddp_step(ddp, &m, ctx->rank, 1));
    TD_CHECK_OK(td_ddp_set_require_sync(ddp, true));
    TD_CHECK_OK(ddp_step(ddp, &m, ctx->rank, 2));
    check_grads(&m, ctx->world_size, 2, 3, 1e-9, "Net after no_sync");
    td_ddp_logging_data log;
    TD_CHECK_OK(td_ddp_logging(ddp, &log));
    TD_CHECK_EQ(log.iteration, 1);
    teardown(ctx, pg, &m, ddp);
}

/* .grad is a view into the bucket after the first reduction, and stays right across the rebuild. */
TD_PG_TEST_ON(gradient_as_bucket_view, 2, DDP_BACKENDS, .timeout_s = 60)
{
    td_ddp_options o = TD_DDP_OPTIONS_INIT;
    o.gradient_as_bucket_view = true;
    model m;
    td_ddp *ddp = NULL;
    td_pg *pg = setup(ctx, NET, &o, &m, &ddp);
    for (int it = 0; it < 3; it++) {
        TD_CHECK_OK(ddp_step(ddp, &m, ctx->rank, it));
        check_grads(&m, ctx->world_size, it, 1, 1e-9, "Net, gradient_as_bucket_view");
        td_tensor *g0 = td_autograd_get_grad(m.p[0]), *g1 = td_autograd_get_grad(m.p[1]);
        TD_CHECK(g0 && g1 && td_tensor_storage(g0) == td_tensor_storage(g1)); /* one bucket */
        td_tensor_release(g0);
        td_tensor_release(g1);
        for (int i = 0; i < m.n; i++) { /* zero_grad(set_to_none=False): in place, the views stay */
            td_tensor *g = td_autograd_get_grad(m.p[i]);
            if (g)
                TD_CHECK_OK(td_tensor_fill(g, 0));
            td_tensor_release(g);
        }
    }
    teardown(ctx, pg, &m, ddp);
}

/* A user hook: all_reduce AVG of the bucket (the group averages), returning its own future. */
static td_status avg_hook(void *state, td_ddp_bucket *bucket, td_future **out)
{
    int *calls = state;
    (*calls)++;
    return td_pg_all_reduce(td_ddp_bucket_group(bucket), td_ddp_bucket_buffer(bucket), TD_OP_AVG, out);
}

TD_PG_TEST_ON(comm_hooks, 3, DDP_BACKENDS, .timeout_s = 120)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    const char *names[] = {"default", "allreduce_hook", "fp16", "bf16", "user AVG hook"};
    td_ddp_comm_hook_fn hooks[] = {NULL, td_ddp_allreduce_hook, td_ddp_fp16_compress_hook, td_ddp_bf16_compress_hook,
                                   avg_hook};
    double tol[] = {1e-9, 1e-9, 2e-3, 2e-2, 1e-9};
    for (int h = 0; h < 5; h++) {
        model m;
        model_make(&m, NET, ctx->rank, ctx->rank);
        td_ddp_options o = TD_DDP_OPTIONS_INIT;
        o.bucket_cap_bytes = 1200;
        o.first_bucket_bytes = 800;
        td_ddp *ddp = ddp_make(pg, &m, &o);
        int calls = 0;
        if (hooks[h])
            TD_CHECK_OK(td_ddp_register_comm_hook(ddp, h == 4 ? (void *)&calls : NULL, hooks[h]));
        if (h == 1)
            TD_CHECK_ERR(td_ddp_register_comm_hook(ddp, NULL, td_ddp_allreduce_hook), TD_ERR_INVALID,
                         "register_comm_hook or register_builtin_comm_hook can only be called once.");
        steps_checked(ddp, &m, ctx->rank, ctx->world_size, 0, 2, tol[h], names[h]);
        td_ddp_logging_data log;
        TD_CHECK_OK(td_ddp_logging(ddp, &log));
        if (h == 4)
            TD_CHECK_EQ(calls, 2 * log.num_buckets);
        if (h == 0)
            TD_CHECK_ERR(td_ddp_register_comm_hook(ddp, NULL, td_ddp_allreduce_hook), TD_ERR_INVALID,
                         "before the first backward");
        td_ddp_free(ddp);
        model_free(&m);
    }
    pg_test_done(ctx, pg);
}

/* ---- uneven inputs: Join --------------------------------------------------------------------- */

/* One SGD step on the parameters (lr 0.1) under no_grad. */
static void sgd(model *m)
{
    TD_NO_GRAD
    {
        for (int i = 0; i < m->n; i++) {
            td_tensor *g = td_autograd_get_grad(m->p[i]), *u = NULL, *np = NULL;
            if (!g)
                continue;
            TD_CHECK_OK(td_tensor_mul_scalar(g, td_scalar_float(0.1), &u));
            TD_CHECK_OK(td_tensor_sub(m->p[i], u, &np));
            TD_CHECK_OK(td_tensor_copy(m->p[i], np));
            td_tensor_release(g);
            td_tensor_release(u);
            td_tensor_release(np);
        }
    }
    zero_grads(m);
}

/* Rank r has 5 + r inputs: every loop ends, and all ranks hold the same final parameters (the
 * last joiner's), for both divisors; the BatchNorm model also shadows its buffer broadcasts. */
DDP_TEST_WORLDS(join_uneven_inputs, .timeout_s = 120)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    for (int variant = 0; variant < 2; variant++) {
        model m;
        model_make(&m, variant ? BN : NET, ctx->rank, ctx->rank);
        td_ddp_options o = TD_DDP_OPTIONS_INIT;
        o.bucket_cap_bytes = 1200;
        o.first_bucket_bytes = 800;
        td_ddp *ddp = ddp_make(pg, &m, &o);
        TD_CHECK_OK(td_ddp_join_begin(ddp, variant == 0, false));
        for (int it = 0; it < 5 + ctx->rank; it++) {
            TD_CHECK_OK(ddp_step(ddp, &m, ctx->rank, it));
            sgd(&m);
        }
        TD_CHECK_OK(td_ddp_join_end(ddp));
        for (int i = 0; i < m.n; i++) {
            td_tensor *c = NULL;
            TD_CHECK_OK(td_tensor_clone(m.p[i], &c));
            TD_CHECK_OK(td_pg_broadcast(pg, c, 0, NULL));
            TD_CHECK_MSG(td_tensor_equal(c, m.p[i]), "%s differs from rank 0's after join", m.names[i]);
            td_tensor_release(c);
        }
        td_ddp_logging_data log;
        TD_CHECK_OK(td_ddp_logging(ddp, &log));
        TD_CHECK_EQ(log.iteration, 5 + ctx->rank);
        td_ddp_free(ddp);
        model_free(&m);
    }
    pg_test_done(ctx, pg);
}

/* throw_on_early_termination: rank 0 (fewest inputs) fails join_end with "Rank 0 exhausted all
 * inputs.", the others their next pre_forward with the "Detected ..." error; all completed 5. */
TD_PG_TEST_ON(join_throw_on_early_termination, 3, DDP_BACKENDS, .timeout_s = 60)
{
    model m;
    td_ddp *ddp = NULL;
    td_pg *pg = setup(ctx, NET, NULL, &m, &ddp);
    TD_CHECK_OK(td_ddp_join_begin(ddp, true, true));
    int done = 0;
    td_status st = TD_OK;
    for (int it = 0; it < 5 + ctx->rank && st == TD_OK; it++) {
        st = ddp_step(ddp, &m, ctx->rank, it);
        if (st == TD_OK) {
            sgd(&m);
            done++;
        }
    }
    if (ctx->rank == 0) {
        TD_CHECK_OK(st);
        TD_CHECK_ERR(td_ddp_join_end(ddp), TD_ERR_INVALID, "Rank 0 exhausted all inputs.");
    } else {
        TD_CHECK_EQ(st, TD_ERR_INVALID);
        TD_CHECK_CONTAINS(td_last_error(), "Detected at least one rank that exhausted inputs. Throwing across all ranks.");
        TD_CHECK_OK(td_ddp_join_end(ddp));
    }
    TD_CHECK_EQ(done, 5);
    teardown(ctx, pg, &m, ddp);
}

/* ---- post-local SGD and model averaging ------------------------------------------------------- */

/* Four ranks, subgroups {0, 1} and {2, 3}: two iterations averaged over all, then over the subgroup. */
TD_PG_TEST_ON(post_local_sgd_hook, 4, DDP_BACKENDS, .timeout_s = 60)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    int lo[] = {0, 1}, hi[] = {2, 3};
    td_pg *g_lo = NULL, *g_hi = NULL;
    TD_CHECK_OK(td_pg_new_group(pg, lo, 2, NULL, &g_lo));
    TD_CHECK_OK(td_pg_new_group(pg, hi, 2, NULL, &g_hi));
    td_pg *mine = ctx->rank < 2 ? g_lo : g_hi;
    model m;
    model_make(&m, NET, ctx->rank, ctx->rank);
    td_ddp *ddp = ddp_make(pg, &m, NULL);
    td_post_local_sgd_state st = TD_POST_LOCAL_SGD_STATE_INIT(mine, 2);
    TD_CHECK_OK(td_ddp_register_comm_hook(ddp, &st, td_ddp_post_local_sgd_hook));
    int all[] = {0, 1, 2, 3};
    for (int it = 0; it < 4; it++) {
        TD_CHECK_OK(ddp_step(ddp, &m, ctx->rank, it));
        if (it < 2)
            check_grads_over(&m, all, 4, it, 1e-9, "post-local SGD, global phase");
        else
            check_grads_over(&m, ctx->rank < 2 ? lo : hi, 2, it, 1e-9, "post-local SGD, local phase");
        zero_grads(&m);
    }
    TD_CHECK_EQ(st.iter, 2);
    td_ddp_free(ddp);
    model_free(&m);
    td_pg_destroy(g_lo);
    td_pg_destroy(g_hi);
    pg_test_done(ctx, pg);
}

/* PeriodicModelAverager(period 2, warmup 1) over local SGD steps that drift apart per rank. */
TD_PG_TEST_ON(periodic_model_averager, 3, DDP_BACKENDS, .timeout_s = 60)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    model m;
    model_make(&m, NET, 0, 0);
    td_model_averager avg = TD_MODEL_AVERAGER_INIT(2, 1);
    avg.process_group = pg;
    for (int step = 0; step < 5; step++) {
        td_tensor *outs[4];
        int no;
        td_tensor *loss = forward(&m, ctx->rank, step, outs, &no);
        TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
        td_tensor_release(loss);
        release_outs(outs, no);
        sgd(&m);
        td_tensor *want = NULL; /* the group average of fc1 before averaging */
        TD_CHECK_OK(td_tensor_clone(m.p[0], &want));
        TD_CHECK_OK(td_pg_all_reduce(pg, want, TD_OP_AVG, NULL));
        bool averaged = false;
        TD_CHECK_OK(td_model_average_parameters(&avg, m.p, m.n, &averaged));
        TD_CHECK_EQ(averaged, step == 1 || step == 3);
        td_tensor *r0 = NULL;
        TD_CHECK_OK(td_tensor_clone(m.p[0], &r0));
        TD_CHECK_OK(td_pg_broadcast(pg, r0, 0, NULL));
        if (averaged) {
            TD_CHECK(td_tensor_allclose(m.p[0], want, 1e-12, 1e-12, false));
            TD_CHECK(td_tensor_equal(m.p[0], r0));
        } else if (ctx->rank != 0 && step > 0) {
            TD_CHECK(!td_tensor_equal(m.p[0], r0)); /* drifted apart since */
        }
        td_tensor_release(want);
        td_tensor_release(r0);
    }
    td_model_averager bad = TD_MODEL_AVERAGER_INIT(0, 0);
    TD_CHECK_ERR(td_model_average_parameters(&bad, m.p, m.n, NULL), TD_ERR_INVALID,
                 "Arg ``period`` must be a positive value.");
    model_free(&m);
    pg_test_done(ctx, pg);
}

/* ---- SyncBatchNorm ------------------------------------------------------------------------------ */

/* Batch norm over the whole [N, C, L] batch from composed autograd ops (the reference). */
static td_tensor *ref_batch_norm(td_tensor *x, td_tensor *w, td_tensor *b, int64_t c, td_tensor **mean_out,
                                 td_tensor **var_out)
{
    td_tensor *mean0 = NULL, *mean = NULL, *xc = NULL, *sq = NULL, *v0 = NULL, *var = NULL, *ve = NULL, *sd = NULL;
    td_tensor *xn = NULL, *wv = NULL, *bv = NULL, *y1 = NULL, *y = NULL;
    TD_CHECK_OK(td_autograd_mean_dim(x, 0, true, &mean0));
    TD_CHECK_OK(td_autograd_mean_dim(mean0, 2, true, &mean));
    TD_CHECK_OK(td_autograd_sub(x, mean, &xc));
    TD_CHECK_OK(td_autograd_mul(xc, xc, &sq));
    TD_CHECK_OK(td_autograd_mean_dim(sq, 0, true, &v0));
    TD_CHECK_OK(td_autograd_mean_dim(v0, 2, true, &var));
    TD_CHECK_OK(td_autograd_add_scalar(var, 1e-5, &ve));
    TD_CHECK_OK(td_autograd_pow_scalar(ve, 0.5, &sd));
    TD_CHECK_OK(td_autograd_div(xc, sd, &xn));
    TD_CHECK_OK(td_autograd_view(w, TD_SHAPE(1, c, 1), &wv));
    TD_CHECK_OK(td_autograd_view(b, TD_SHAPE(1, c, 1), &bv));
    TD_CHECK_OK(td_autograd_mul(xn, wv, &y1));
    TD_CHECK_OK(td_autograd_add(y1, bv, &y));
    *mean_out = td_tensor_retain(mean);
    *var_out = td_tensor_retain(var);
    td_tensor *all[] = {mean0, mean, xc, sq, v0, var, ve, sd, xn, wv, bv, y1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_tensor_release(all[i]);
    return y;
}

static td_tensor *leaf_of(td_tensor *t)
{
    TD_CHECK_OK(td_autograd_set_requires_grad(t, true));
    return t;
}

/* ONLY_SBN_NET: SyncBatchNorm(2, momentum=0.99) on each rank's [4, 2, 3] batch: outputs, the input
 * gradient, the summed weight and bias gradients and the running statistics equal batch norm over
 * the concatenated batch. */
DDP_TEST_WORLDS(sync_batch_norm, .timeout_s = 60)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    const int64_t n = 4, c = 2, l = 3;
    int ws = ctx->world_size;
    td_tensor *x = leaf_of(flat_values(TD_FLOAT64, TD_SHAPE(n, c, l), 200 + ctx->rank, 2.0));
    td_tensor *w = leaf_of(flat_values(TD_FLOAT64, TD_SHAPE(c), 300, 1.0));
    td_tensor *b = leaf_of(flat_values(TD_FLOAT64, TD_SHAPE(c), 400, 1.0));
    td_tensor *rm = flat_values(TD_FLOAT64, TD_SHAPE(c), 500, 0.1), *rv = NULL, *y = NULL, *prod = NULL, *loss = NULL;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT64, TD_SHAPE(c), 1.0, &rv));
    td_tensor *coef = flat_values(TD_FLOAT64, TD_SHAPE(n, c, l), 600 + ctx->rank, 1.0);
    TD_CHECK_OK(td_sync_batch_norm(pg, x, w, b, rm, rv, 0.99, 1e-5, &y));
    TD_CHECK_OK(td_autograd_mul(y, coef, &prod));
    TD_CHECK_OK(td_autograd_sum(prod, &loss));
    TD_CHECK_OK(td_autograd_backward(loss, NULL, false));

    /* The reference over every rank's batch. */
    td_tensor *xs[4], *cs[4], *xall = NULL, *call = NULL, *rmean = NULL, *rvar = NULL;
    for (int r = 0; r < ws; r++) {
        xs[r] = flat_values(TD_FLOAT64, TD_SHAPE(n, c, l), 200 + r, 2.0);
        cs[r] = flat_values(TD_FLOAT64, TD_SHAPE(n, c, l), 600 + r, 1.0);
    }
    TD_CHECK_OK(td_tensor_cat((const td_tensor *const *)xs, ws, 0, &xall));
    TD_CHECK_OK(td_tensor_cat((const td_tensor *const *)cs, ws, 0, &call));
    xall = leaf_of(xall);
    td_tensor *w0 = leaf_of(flat_values(TD_FLOAT64, TD_SHAPE(c), 300, 1.0));
    td_tensor *b0 = leaf_of(flat_values(TD_FLOAT64, TD_SHAPE(c), 400, 1.0));
    td_tensor *yref = ref_batch_norm(xall, w0, b0, c, &rmean, &rvar), *pref = NULL, *lref = NULL;
    TD_CHECK_OK(td_autograd_mul(yref, call, &pref));
    TD_CHECK_OK(td_autograd_sum(pref, &lref));
    TD_CHECK_OK(td_autograd_backward(lref, NULL, false));

    td_tensor *yrows = NULL, *gall = td_autograd_get_grad(xall), *grows = NULL, *gx = td_autograd_get_grad(x);
    TD_CHECK_OK(td_tensor_narrow(yref, 0, ctx->rank * n, n, &yrows));
    TD_CHECK_OK(td_tensor_narrow(gall, 0, ctx->rank * n, n, &grows));
    TD_CHECK_MSG(td_tensor_allclose(y, yrows, 1e-9, 1e-9, false), "SyncBatchNorm's output differs");
    TD_CHECK_MSG(gx && td_tensor_allclose(gx, grows, 1e-9, 1e-9, false), "SyncBatchNorm's input gradient differs");
    td_tensor *params[2] = {w, b}, *refs[2] = {w0, b0};
    for (int i = 0; i < 2; i++) {
        td_tensor *g = td_autograd_get_grad(params[i]), *sum = NULL, *want = td_autograd_get_grad(refs[i]);
        TD_CHECK_OK(td_tensor_clone(g, &sum));
        TD_CHECK_OK(td_pg_all_reduce(pg, sum, TD_OP_SUM, NULL));
        TD_CHECK_MSG(td_tensor_allclose(sum, want, 1e-9, 1e-9, false), "the %s gradients do not add up",
                     i ? "bias" : "weight");
        td_tensor *rel[] = {g, sum, want};
        for (int k = 0; k < 3; k++)
            td_tensor_release(rel[k]);
    }
    double count = (double)(ws * n * l);
    for (int64_t k = 0; k < c; k++) {
        int64_t i3[3] = {0, k, 0};
        double mu = 0, var = 0, got_m = 0, got_v = 0, rm0 = 0;
        td_tensor *rm_init = flat_values(TD_FLOAT64, TD_SHAPE(c), 500, 0.1);
        TD_CHECK_OK(td_tensor_get_f64(rm_init, &k, &rm0));
        td_tensor_release(rm_init);
        TD_CHECK_OK(td_tensor_get_f64(rmean, i3, &mu));
        TD_CHECK_OK(td_tensor_get_f64(rvar, i3, &var));
        TD_CHECK_OK(td_tensor_get_f64(rm, &k, &got_m));
        TD_CHECK_OK(td_tensor_get_f64(rv, &k, &got_v));
        TD_CHECK(fabs(got_m - (0.01 * rm0 + 0.99 * mu)) < 1e-12);
        TD_CHECK(fabs(got_v - (0.01 * 1.0 + 0.99 * var * count / (count - 1))) < 1e-12);
    }
    td_tensor *bad = NULL;
    TD_CHECK_ERR(td_sync_batch_norm(pg, w, NULL, NULL, NULL, NULL, 0.1, 1e-5, &bad), TD_ERR_INVALID,
                 "expected at least 2D input (got 1D input)");
    TD_CHECK(bad == NULL);
    td_tensor *all[] = {x, w, b, rm, rv, y, prod, loss, coef, xall, call, rmean, rvar, w0, b0, yref, pref, lref,
                        yrows, gall, grows, gx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_tensor_release(all[i]);
    for (int r = 0; r < ws; r++) {
        td_tensor_release(xs[r]);
        td_tensor_release(cs[r]);
    }
    pg_test_done(ctx, pg);
}

TD_TEST_MAIN()
