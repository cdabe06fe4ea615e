/* model_parallel: ddp_train's model split across two workers and trained by a third through RPC,
 * distributed autograd and the DistributedOptimizer (torch.distributed.rpc's model-parallel
 * pattern).
 *
 *   tdrun --standalone --nproc-per-node 3 ./model_parallel [--epochs N] [--samples N] [--hidden N]
 *                                                          [--batch N] [--lr X] [--seed N] [--target A]
 *                                                          [--bench-steps N]
 *
 * Worker "stage1" owns the first layer (w1, b1), worker "stage2" the two others (w2, b2, w3, b3):
 * the trainer makes each parameter on its owner with td_rpc_remote, from ddp_train's initial
 * values, and keeps the RRefs. Each step, inside a distributed autograd context, the trainer sends
 * its batch (twice --batch samples, the global batch of ddp_train on two ranks) to stage1, whose
 * activations it sends to stage2, computes the cross-entropy of the logits that come back,
 * runs the distributed backward (gradients flow back through both workers) and steps the
 * DistributedOptimizer (SGD, momentum 0.9, ddp_train's learning rate and its 0.3x decay over the
 * last quarter of the epochs), which updates each owner's parameters with that context's
 * gradients. After each epoch the trainer prints the loss and the test accuracy of a
 * forward pass outside any context. It exits 1 when the final accuracy is below the target.
 * --bench-steps N times N steps on one batch instead (after 20 to warm up) and prints the median
 * ("step_ms"), for bench/autograd/dist_run.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/tdist.h>

#include "mlp.h"

enum { N_TEST = 4000, N_PARAMS = 6 };

#define TRY(expr)                   \
    do {                            \
        td_status try_st_ = (expr); \
        if (try_st_ != TD_OK)       \
            return try_st_;         \
    } while (0)

/* ---- what the stages serve -------------------------------------------------------------------- */

/* The owner's tensor an RRef argument names (borrowed from the owner's value). */
static td_tensor *owned(const td_value *v)
{
    td_rref *r = td_value_get_rref(v);
    td_value *value = NULL;
    if (!r || td_rref_local_value(r, &value) != TD_OK)
        return NULL;
    td_tensor *t = td_value_get_tensor(value); /* the RRef keeps the value alive */
    td_value_release(value);
    return t;
}

/* make_param(init): a leaf that requires grad, a copy of init; remote() keeps it on this worker. */
static td_status make_param(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[1];
    TRY(td_rpc_bind("make_param", "init", args, kwargs, p));
    td_tensor *t = NULL;
    TRY(td_tensor_clone(td_value_get_tensor(p[0]), &t));
    td_status st = td_autograd_set_requires_grad(t, true);
    if (st == TD_OK)
        *result = td_value_tensor(t);
    td_tensor_release(t);
    return st;
}

/* relu(x @ w + b): one hidden layer on its owner's parameters (recorded for the backward). */
static td_status dense_relu(td_tensor *w, td_tensor *b, td_tensor *x, td_tensor **out)
{
    td_tensor *z = NULL;
    TRY(td_autograd_addmm(b, x, w, &z));
    td_status st = td_autograd_relu(z, out);
    td_tensor_release(z);
    return st;
}

/* stage1(w1, b1, x): the first layer. */
static td_status stage1(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[3];
    TRY(td_rpc_bind("stage1", "w1,b1,x", args, kwargs, p));
    td_tensor *w1 = owned(p[0]), *b1 = owned(p[1]), *h = NULL;
    if (!w1 || !b1 || !td_value_get_tensor(p[2]))
        return td_rpc_raise("TypeError", "stage1(RRef w1, RRef b1, Tensor x)");
    TRY(dense_relu(w1, b1, td_value_get_tensor(p[2]), &h));
    *result = td_value_tensor(h);
    td_tensor_release(h);
    return TD_OK;
}

/* stage2(w2, b2, w3, b3, h1): the second hidden layer and the logits. */
static td_status stage2(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[5];
    TRY(td_rpc_bind("stage2", "w2,b2,w3,b3,h1", args, kwargs, p));
    td_tensor *w2 = owned(p[0]), *b2 = owned(p[1]), *w3 = owned(p[2]), *b3 = owned(p[3]), *h2 = NULL, *logits = NULL;
    if (!w2 || !b2 || !w3 || !b3 || !td_value_get_tensor(p[4]))
        return td_rpc_raise("TypeError", "stage2(RRef w2, RRef b2, RRef w3, RRef b3, Tensor h1)");
    TRY(dense_relu(w2, b2, td_value_get_tensor(p[4]), &h2));
    td_status st = td_autograd_addmm(b3, h2, w3, &logits);
    td_tensor_release(h2);
    if (st == TD_OK)
        *result = td_value_tensor(logits);
    td_tensor_release(logits);
    return st;
}

/* ---- the trainer ------------------------------------------------------------------------------ */

static train_config cfg;

typedef struct model_rrefs {
    td_rref *p[N_PARAMS]; /* w1, b1 (stage1); w2, b2, w3, b3 (stage2) */
} model_rrefs;

/* The logits of x [n, DIM] through both stages (*logits: a new reference). */
static td_status forward_rpc(const model_rrefs *m, td_tensor *x, td_tensor **logits)
{
    td_value *a1 = td_value_tuple_of(3, td_rref_value(m->p[0]), td_rref_value(m->p[1]), td_value_tensor(x)), *h1 = NULL;
    td_status st = td_rpc_sync(NULL, td_rpc_to_name("stage1"), "stage1", a1, NULL, TD_RPC_DEFAULT_TIMEOUT, &h1);
    td_value_release(a1);
    TRY(st);
    td_value *a2 = td_value_tuple_of(5, td_rref_value(m->p[2]), td_rref_value(m->p[3]), td_rref_value(m->p[4]),
                                     td_rref_value(m->p[5]), td_value_retain(h1)),
             *out = NULL;
    st = td_rpc_sync(NULL, td_rpc_to_name("stage2"), "stage2", a2, NULL, TD_RPC_DEFAULT_TIMEOUT, &out);
    td_value_release(a2);
    td_value_release(h1);
    TRY(st);
    *logits = td_tensor_retain(td_value_get_tensor(out));
    td_value_release(out);
    return TD_OK;
}

/* A tensor of the n rows idx[0..n) of x (n x cols), and their labels as int64. */
static td_status gather_batch(const float *x, const int *y, const int *idx, int n, td_tensor **xb, td_tensor **yb)
{
    TRY(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(n, DIM), xb));
    TRY(td_tensor_zeros(TD_INT64, TD_SHAPE(n), yb));
    float *xd = td_tensor_data(*xb);
    int64_t *yd = td_tensor_data(*yb);
    for (int i = 0; i < n; i++) {
        memcpy(xd + (size_t)i * DIM, x + (size_t)(idx ? idx[i] : i) * DIM, sizeof(float) * DIM);
        yd[i] = y[idx ? idx[i] : i];
    }
    return TD_OK;
}

/* The parameters on their owners, from ddp_train's initial values. */
static td_status make_model(model_rrefs *m)
{
    size_t np = model_size(cfg.hidden);
    float *flat = calloc(np, sizeof(float));
    model init;
    model_bind(&init, flat, cfg.hidden);
    model_init(&init, cfg.seed);
    const float *src[N_PARAMS] = {init.w1, init.b1, init.w2, init.b2, init.w3, init.b3};
    const int64_t h = cfg.hidden;
    const td_shape shapes[N_PARAMS] = {TD_SHAPE(DIM, h), TD_SHAPE(h), TD_SHAPE(h, h), TD_SHAPE(h), TD_SHAPE(h, CLASSES),
                                       TD_SHAPE(CLASSES)};
    td_status st = TD_OK;
    for (int i = 0; i < N_PARAMS && st == TD_OK; i++) {
        td_tensor *t = NULL;
        st = td_tensor_zeros(TD_FLOAT32, shapes[i], &t);
        if (st != TD_OK)
            break;
        memcpy(td_tensor_data(t), src[i], sizeof(float) * (size_t)td_tensor_numel(t));
        td_value *args = td_value_tuple_of(1, td_value_tensor(t));
        st = td_rpc_remote(NULL, td_rpc_to_name(i < 2 ? "stage1" : "stage2"), "make_param", args, NULL,
                           TD_RPC_DEFAULT_TIMEOUT, &m->p[i]);
        td_value_release(args);
        td_tensor_release(t);
    }
    free(flat);
    return st;
}

/* The test accuracy of a forward pass outside any context (nothing is kept for a backward). */
static td_status evaluate(const model_rrefs *m, const float *x, const int *y, double *acc)
{
    td_tensor *xb = NULL, *yb = NULL, *logits = NULL;
    TRY(gather_batch(x, y, NULL, N_TEST, &xb, &yb));
    td_status st = forward_rpc(m, xb, &logits);
    if (st == TD_OK) {
        const float *l = td_tensor_data(logits);
        const int64_t *t = td_tensor_data(yb);
        int correct = 0;
        for (int i = 0; i < N_TEST; i++) {
            int best = 0;
            for (int c = 1; c < CLASSES; c++)
                best = l[i * CLASSES + c] > l[i * CLASSES + best] ? c : best;
            correct += best == t[i];
        }
        *acc = (double)correct / N_TEST;
    }
    td_tensor_release(logits);
    td_tensor_release(xb);
    td_tensor_release(yb);
    return st;
}

/* One step in a fresh context: forward through both stages, the loss here, the distributed
 * backward, the optimizer. *loss gets the batch's mean loss. */
static td_status train_step(const model_rrefs *m, td_dist_optimizer *opt, td_tensor *xb, td_tensor *yb, double *loss)
{
    int64_t ctx = -1;
    TRY(td_dist_autograd_context_enter(NULL, &ctx));
    td_tensor *logits = NULL, *l = NULL;
    td_status st = forward_rpc(m, xb, &logits);
    if (st == TD_OK)
        st = td_autograd_cross_entropy(logits, yb, TD_REDUCTION_MEAN, -100, &l);
    if (st == TD_OK) {
        *loss = *(const float *)td_tensor_data(l);
        st = td_dist_autograd_backward(ctx, &l, 1, false);
    }
    if (st == TD_OK)
        st = td_dist_optimizer_step(opt, ctx);
    td_tensor_release(l);
    td_tensor_release(logits);
    td_status exit_st = td_dist_autograd_context_exit(ctx);
    return st != TD_OK ? st : exit_st;
}

static int check(td_status st, const char *what)
{
    if (st != TD_OK) {
        fprintf(stderr, "model_parallel: %s failed: %s: %s\n", what, td_status_str(st), td_last_error());
        return 1;
    }
    return 0;
}

/* --bench-steps: the median time of one step, on one batch. */
static int bench(int steps)
{
    float *x = malloc(sizeof(float) * DIM * (size_t)cfg.batch * 2);
    int *y = malloc(sizeof(int) * (size_t)cfg.batch * 2);
    make_data(cfg.seed, cfg.batch * 2, x, y);
    model_rrefs m = {{NULL}};
    td_dist_optimizer *opt = NULL;
    td_optim_options o = td_optim_options_default();
    o.lr = cfg.lr;
    o.momentum = 0.9;
    td_tensor *xb = NULL, *yb = NULL;
    int rc = check(make_model(&m), "make_model") ||
             check(td_dist_optimizer_create(TD_OPTIM_SGD, &o, m.p, N_PARAMS, &opt), "DistributedOptimizer") ||
             check(gather_batch(x, y, NULL, cfg.batch * 2, &xb, &yb), "batch");
    double *ms = malloc(sizeof(double) * (size_t)steps);
    for (int i = 0; i < steps + 20 && !rc; i++) {
        double t0 = mlp_now_s(), loss = 0;
        rc = check(train_step(&m, opt, xb, yb, &loss), "train step");
        if (i >= 20)
            ms[i - 20] = (mlp_now_s() - t0) * 1e3;
    }
    if (!rc) {
        for (int i = 1; i < steps; i++) /* insertion sort: a few hundred values */
            for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
                double t = ms[j];
                ms[j] = ms[j - 1];
                ms[j - 1] = t;
            }
        printf("step_ms %.3f\n", steps % 2 ? ms[steps / 2] : (ms[steps / 2 - 1] + ms[steps / 2]) / 2);
    }
    free(ms);
    td_tensor_release(xb);
    td_tensor_release(yb);
    td_dist_optimizer_free(opt);
    for (int i = 0; i < N_PARAMS; i++)
        td_rref_release(m.p[i]);
    free(x);
    free(y);
    return rc;
}

static int train(void)
{
    float *x = malloc(sizeof(float) * DIM * (size_t)(cfg.samples + N_TEST));
    int *y = malloc(sizeof(int) * (size_t)(cfg.samples + N_TEST));
    make_data(cfg.seed, cfg.samples + N_TEST, x, y);
    int batch = cfg.batch * 2, steps_per_epoch = cfg.samples / batch;
    printf("model_parallel: trainer, stage1 (layer 1), stage2 (layers 2-3); MLP %d-%d-%d-%d, %d steps/epoch of %d\n",
           DIM, cfg.hidden, cfg.hidden, CLASSES, steps_per_epoch, batch);
    model_rrefs m = {{NULL}};
    td_dist_optimizer *opt = NULL;
    td_optim_options o = td_optim_options_default();
    o.lr = cfg.lr;
    o.momentum = 0.9;
    int rc = check(make_model(&m), "make_model") ||
             check(td_dist_optimizer_create(TD_OPTIM_SGD, &o, m.p, N_PARAMS, &opt), "DistributedOptimizer");
    int *order = malloc(sizeof(int) * (size_t)cfg.samples);
    for (int i = 0; i < cfg.samples; i++)
        order[i] = i;
    uint64_t shuffle = cfg.seed;
    double acc = 0, t0 = mlp_now_s();
    long steps = 0;
    for (int epoch = 1; epoch <= cfg.epochs && !rc; epoch++) {
        double t_epoch = mlp_now_s(), loss_sum = 0;
        /* ddp_train's schedule: the learning rate drops to 0.3x for the last quarter of the epochs. */
        rc = check(td_dist_optimizer_set_lr(opt, cfg.lr * (epoch > cfg.epochs * 3 / 4 ? 0.3 : 1.0)), "set_lr");
        for (int i = cfg.samples - 1; i > 0; i--) { /* ddp_train's permutation */
            int j = (int)(rng_next(&shuffle) % (uint64_t)(i + 1));
            int t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int step = 0; step < steps_per_epoch && !rc; step++, steps++) {
            td_tensor *xb = NULL, *yb = NULL;
            double loss = 0;
            rc = check(gather_batch(x, y, order + (size_t)step * batch, batch, &xb, &yb), "batch") ||
                 check(train_step(&m, opt, xb, yb, &loss), "train step");
            loss_sum += loss;
            td_tensor_release(xb);
            td_tensor_release(yb);
        }
        if (rc || check(evaluate(&m, x + (size_t)cfg.samples * DIM, y + cfg.samples, &acc), "evaluate"))
            rc = 1;
        else
            printf("epoch %2d/%d loss %.4f  test accuracy %5.1f%%  %.2fs\n", epoch, cfg.epochs,
                   loss_sum / steps_per_epoch, acc * 100, mlp_now_s() - t_epoch);
        fflush(stdout);
    }
    if (!rc) {
        double elapsed = mlp_now_s() - t0;
        printf("model_parallel: %ld steps in %.2fs (%.3f ms per step)\n", steps, elapsed, 1e3 * elapsed / (double)steps);
        if (acc < cfg.target) {
            printf("FAILED: test accuracy %.1f%% is below the %.0f%% target\n", acc * 100, cfg.target * 100);
            rc = 1;
        } else {
            printf("model_parallel: trained to %.1f%% test accuracy across 2 workers\n", acc * 100);
        }
    }
    td_dist_optimizer_free(opt);
    for (int i = 0; i < N_PARAMS; i++)
        td_rref_release(m.p[i]);
    free(order);
    free(x);
    free(y);
    return rc;
}

int main(int argc, char **argv)
{
    train_config_parse(argc, argv, &cfg);
    const char *rank_s = getenv("RANK"), *world_s = getenv("WORLD_SIZE");
    int rank = rank_s ? atoi(rank_s) : 0, world = world_s ? atoi(world_s) : 1;
    if (world != 3) {
        fprintf(stderr, "model_parallel: needs 3 workers, a trainer and two stages (tdrun --nproc-per-node 3)\n");
        return 2;
    }
    static const char *const names[] = {"trainer", "stage1", "stage2"};
    if (check(td_rpc_register("make_param", make_param, NULL), "register") ||
        check(td_rpc_register("stage1", stage1, NULL), "register") ||
        check(td_rpc_register("stage2", stage2, NULL), "register") ||
        check(td_rpc_init(names[rank], rank, world, NULL), "init_rpc"))
        return 1;
    int bench_steps = 0;
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--bench-steps") == 0)
            bench_steps = atoi(argv[i + 1]);
    int rc = rank != 0 ? 0 : bench_steps > 0 ? bench(bench_steps) : train();
    /* The stages serve until the trainer is done: the graceful shutdown waits for it. */
    if (check(td_rpc_shutdown(true, 0), "shutdown"))
        rc = 1;
    return rc;
}
