/* The DistributedOptimizer (tdist/dist_optim.h) across real worker processes, against a
 * single-process reference.
 *
 * The model: h = tanh(x @ W1 + b1) with W1 and b1 on worker1, y = h @ W2 with W2 on worker2, and
 * loss = mean((y - target)^2) on the trainer (worker0). The trainer creates the parameters on
 * their owners with remote() (so it holds user RRefs), and trains a few steps: in a fresh
 * distributed autograd context each step, the forward through RPC, the distributed backward, and
 * td_dist_optimizer_step. The reference runs the same computation with the local engine in one
 * process and updates the parameters with PyTorch's SGD and Adam formulas written out here. Losses
 * and final parameters must agree to 1e-6, for SGD with momentum (dampening, weight decay), SGD with
 * Nesterov momentum, and Adam (weight decay). The owners' local optimizers are gone after
 * td_dist_optimizer_free, and the option checks use PyTorch's messages. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/autograd.h>
#include <tdist/dist_autograd.h>
#include <tdist/dist_optim.h>
#include <tdist/rref.h>
#include <tdist/rpc.h>
#include <tdist/testing.h>

#include "autograd/dist_autograd_impl.h"
#include "rpc_util.h"

enum { BATCH = 5, IN = 4, HIDDEN = 3, OUT = 2, STEPS = 4, NPARAMS = 3 };

/* Deterministic values in [-1, 1). */
static td_tensor *values(int64_t rows, int64_t cols, unsigned seed)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(cols ? td_tensor_empty(TD_FLOAT64, TD_SHAPE(rows, cols), &t)
                     : td_tensor_empty(TD_FLOAT64, TD_SHAPE(rows), &t));
    double *d = td_tensor_data(t);
    unsigned s = seed * 2654435761u + 12345u;
    for (int64_t i = 0; i < td_tensor_numel(t); i++) {
        s = s * 1103515245u + 12345u;
        d[i] = ((double)((s >> 8) & 0xffff) / 32768.0) - 1.0;
    }
    return t;
}

static td_tensor *tensor_arg(const td_value *v)
{
    return v && td_value_kind_of(v) == TD_VAL_TENSOR ? td_value_get_tensor(v) : NULL;
}

static td_tensor *owner_tensor(const td_value *rref_value)
{
    td_rref *r = td_value_get_rref(rref_value);
    td_value *v = NULL;
    if (!r || td_rref_local_value(r, &v) != TD_OK || !v || td_value_kind_of(v) != TD_VAL_TENSOR) {
        td_value_release(v);
        return NULL;
    }
    td_tensor *t = td_tensor_retain(td_value_get_tensor(v));
    td_value_release(v);
    return t;
}

/* ---- the functions the owners serve ------------------------------------------------------------ */

/* dopt_param(init): a leaf that requires grad, a copy of init (kept by remote() on the owner). */
static td_status fn_param(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[1];
    if (td_rpc_bind("dopt_param", "init", args, kwargs, p) != TD_OK || !tensor_arg(p[0]))
        return TD_ERR_REMOTE;
    td_tensor *t = NULL;
    td_status st = td_tensor_clone(tensor_arg(p[0]), &t);
    if (st == TD_OK)
        st = td_autograd_set_requires_grad(t, true);
    if (st == TD_OK)
        *result = td_value_tensor(t);
    td_tensor_release(t);
    return st;
}

/* dopt_layer1(w, b, x): tanh(x @ w + b) with the owner's w and b. */
static td_status fn_layer1(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[3];
    if (td_rpc_bind("dopt_layer1", "w,b,x", args, kwargs, p) != TD_OK)
        return TD_ERR_REMOTE;
    td_tensor *w = owner_tensor(p[0]), *b = owner_tensor(p[1]), *z = NULL, *h = NULL;
    td_status st = w && b && tensor_arg(p[2]) ? td_autograd_addmm(b, tensor_arg(p[2]), w, &z)
                                              : td_rpc_raise("TypeError", "dopt_layer1(RRef, RRef, Tensor)");
    if (st == TD_OK)
        st = td_autograd_tanh(z, &h);
    if (st == TD_OK)
        *result = td_value_tensor(h);
    td_tensor_release(w);
    td_tensor_release(b);
    td_tensor_release(z);
    td_tensor_release(h);
    return st;
}

/* dopt_layer2(w, h): h @ w with the owner's w. */
static td_status fn_layer2(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[2];
    if (td_rpc_bind("dopt_layer2", "w,h", args, kwargs, p) != TD_OK)
        return TD_ERR_REMOTE;
    td_tensor *w = owner_tensor(p[0]), *y = NULL;
    td_status st =
        w && tensor_arg(p[1]) ? td_autograd_mm(tensor_arg(p[1]), w, &y) : td_rpc_raise("TypeError", "dopt_layer2");
    if (st == TD_OK)
        *result = td_value_tensor(y);
    td_tensor_release(w);
    td_tensor_release(y);
    return st;
}

/* dopt_num_local(): the local optimizers this worker holds. */
static td_status fn_num_local(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    *result = td_value_int((int64_t)dist_optim_local_count());
    return TD_OK;
}

static void dopt_up(td_test_ctx *ctx)
{
    const rpc_test_function fns[] = {{"dopt_param", fn_param, NULL, NULL},
                                     {"dopt_layer1", fn_layer1, NULL, NULL},
                                     {"dopt_layer2", fn_layer2, NULL, NULL},
                                     {"dopt_num_local", fn_num_local, NULL, NULL}};
    rpc_test_register(fns, sizeof fns / sizeof fns[0]);
    rpc_test_init(ctx, NULL);
}

static void dopt_down(void)
{
    TD_CHECK_OK(td_rpc_barrier(NULL, NULL, 0, 30000));
    rpc_test_wait_debug("num_autograd_contexts", 0, 10000);
    TD_CHECK_EQ((int64_t)dist_optim_local_count(), 0);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* ---- the model --------------------------------------------------------------------------------- */

typedef struct dopt_data {
    td_tensor *x, *target;
    td_tensor *init[NPARAMS]; /* W1 [IN, HIDDEN], b1 [HIDDEN], W2 [HIDDEN, OUT] */
} dopt_data;

static const int64_t param_owner[NPARAMS] = {1, 1, 2};

static void data_make(dopt_data *d)
{
    d->x = values(BATCH, IN, 1);
    d->target = values(BATCH, OUT, 2);
    d->init[0] = values(IN, HIDDEN, 3);
    d->init[1] = values(HIDDEN, 0, 4);
    d->init[2] = values(HIDDEN, OUT, 5);
}

static void data_free(dopt_data *d)
{
    td_tensor_release(d->x);
    td_tensor_release(d->target);
    for (int i = 0; i < NPARAMS; i++)
        td_tensor_release(d->init[i]);
}

/* mean((y - target)^2), recorded. */
static td_tensor *mse(td_tensor *y, td_tensor *target)
{
    td_tensor *diff = NULL, *sq = NULL, *loss = NULL;
    TD_CHECK_OK(td_autograd_sub(y, target, &diff));
    TD_CHECK_OK(td_autograd_mul(diff, diff, &sq));
    TD_CHECK_OK(td_autograd_mean(sq, &loss));
    td_tensor_release(diff);
    td_tensor_release(sq);
    return loss;
}

static double scalar(const td_tensor *t)
{
    double v = 0;
    int64_t idx[1] = {0};
    TD_CHECK_OK(td_tensor_get_f64(t, td_tensor_numel(t) == 1 && td_tensor_shape(t).ndim == 0 ? NULL : idx, &v));
    return v;
}

/* One parameter's state in the reference optimizer. */
typedef struct ref_state {
    double *first, *second;
    int64_t step;
} ref_state;

/* PyTorch's SGD and Adam (torch/optim/sgd.py, adam.py: _single_tensor_*), written out. */
static void ref_update(td_optim_kind kind, const td_optim_options *o, td_tensor *param, const td_tensor *grad,
                       ref_state *s)
{
    int64_t n = td_tensor_numel(param);
    double *p = td_tensor_data(param);
    const double *g = td_tensor_data(grad);
    if (kind == TD_OPTIM_SGD) {
        bool first = s->first == NULL;
        if (first)
            s->first = calloc((size_t)n, sizeof(double));
        for (int64_t i = 0; i < n; i++) {
            double d_p = g[i] + o->weight_decay * p[i];
            if (o->momentum != 0) {
                if (first)
                    s->first[i] = d_p; /* torch.clone(d_p).detach() */
                else
                    s->first[i] = s->first[i] * o->momentum + (1 - o->dampening) * d_p;
                d_p = o->nesterov ? d_p + o->momentum * s->first[i] : s->first[i];
            }
            p[i] += -o->lr * d_p;
        }
        return;
    }
    if (!s->first) {
        s->first = calloc((size_t)n, sizeof(double));
        s->second = calloc((size_t)n, sizeof(double));
    }
    s->step += 1;
    double bias_correction1 = 1 - pow(o->betas[0], (double)s->step);
    double bias_correction2 = 1 - pow(o->betas[1], (double)s->step);
    double step_size = o->lr / bias_correction1;
    double bias_correction2_sqrt = sqrt(bias_correction2);
    for (int64_t i = 0; i < n; i++) {
        double gi = g[i] + o->weight_decay * p[i];
        s->first[i] = s->first[i] * o->betas[0] + (1 - o->betas[0]) * gi;
        s->second[i] = s->second[i] * o->betas[1] + (1 - o->betas[1]) * gi * gi;
        double denom = sqrt(s->second[i]) / bias_correction2_sqrt + o->eps;
        p[i] += -step_size * s->first[i] / denom;
    }
}

/* The reference: STEPS steps in one process. losses[STEPS]; params: the final values (new). */
static void reference(const dopt_data *d, td_optim_kind kind, const td_optim_options *opts, double lr_decay,
                      double *losses, td_tensor **params)
{
    td_optim_options oo = *opts, *o = &oo;
    td_tensor *p[NPARAMS];
    ref_state st[NPARAMS];
    memset(st, 0, sizeof st);
    for (int i = 0; i < NPARAMS; i++) {
        TD_CHECK_OK(td_tensor_clone(d->init[i], &p[i]));
        TD_CHECK_OK(td_autograd_set_requires_grad(p[i], true));
    }
    for (int step = 0; step < STEPS; step++) {
        if (step == STEPS / 2)
            o->lr *= lr_decay;
        td_tensor *z = NULL, *h = NULL, *y = NULL;
        TD_CHECK_OK(td_autograd_addmm(p[1], d->x, p[0], &z));
        TD_CHECK_OK(td_autograd_tanh(z, &h));
        TD_CHECK_OK(td_autograd_mm(h, p[2], &y));
        td_tensor *loss = mse(y, d->target);
        losses[step] = scalar(loss);
        TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
        for (int i = 0; i < NPARAMS; i++) {
            td_tensor *g = td_autograd_get_grad(p[i]);
            TD_CHECK(g != NULL);
            ref_update(kind, o, p[i], g, &st[i]);
            td_tensor_release(g);
            TD_CHECK_OK(td_autograd_set_grad(p[i], NULL));
        }
        td_tensor *all[] = {z, h, y, loss};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            td_tensor_release(all[i]);
    }
    for (int i = 0; i < NPARAMS; i++) {
        params[i] = p[i];
        free(st[i].first);
        free(st[i].second);
    }
}

static td_tensor *call_tensor(int64_t worker, const char *fn, td_value *args)
{
    td_value *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(worker), fn, args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    td_value_release(args);
    TD_CHECK(r && td_value_kind_of(r) == TD_VAL_TENSOR);
    td_tensor *t = td_tensor_retain(td_value_get_tensor(r));
    td_value_release(r);
    return t;
}

static int64_t remote_num_local(int64_t worker)
{
    td_value *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(worker), "dopt_num_local", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    TD_CHECK(r && td_value_kind_of(r) == TD_VAL_INT);
    int64_t n = td_value_get_int(r);
    td_value_release(r);
    return n;
}

/* The trainer: the distributed training beside the reference; from step STEPS / 2 on, the learning
 * rate is multiplied by lr_decay (td_dist_optimizer_set_lr, as a scheduler would). */
static void train_and_compare(td_optim_kind kind, const td_optim_options *o, double lr_decay, const char *what)
{
    dopt_data d;
    data_make(&d);
    td_rref *params[NPARAMS];
    for (int i = 0; i < NPARAMS; i++) {
        td_value *args = td_value_tuple_of(1, td_value_tensor(d.init[i]));
        TD_CHECK_OK(td_rpc_remote(NULL, td_rpc_to_id(param_owner[i]), "dopt_param", args, NULL, -1, &params[i]));
        td_value_release(args);
    }
    td_dist_optimizer *opt = NULL;
    TD_CHECK_OK(td_dist_optimizer_create(kind, o, params, NPARAMS, &opt));
    double losses[STEPS];
    for (int step = 0; step < STEPS; step++) {
        if (step == STEPS / 2) {
            TD_CHECK_OK(td_dist_optimizer_set_lr(opt, o->lr * lr_decay));
            TD_CHECK(td_dist_optimizer_lr(opt) == o->lr * lr_decay);
        }
        int64_t id = -1;
        TD_CHECK_OK(td_dist_autograd_context_enter(NULL, &id));
        td_tensor *h = call_tensor(1, "dopt_layer1", td_value_tuple_of(3, td_rref_value(params[0]),
                                                                       td_rref_value(params[1]),
                                                                       td_value_tensor(d.x)));
        td_tensor *y = call_tensor(2, "dopt_layer2", td_value_tuple_of(2, td_rref_value(params[2]),
                                                                       td_value_tensor(h)));
        td_tensor *loss = mse(y, d.target);
        losses[step] = scalar(loss);
        TD_CHECK_OK(td_dist_autograd_backward(id, &loss, 1, false));
        TD_CHECK_OK(td_dist_optimizer_step(opt, id));
        TD_CHECK_OK(td_dist_autograd_context_exit(id));
        td_tensor_release(h);
        td_tensor_release(y);
        td_tensor_release(loss);
    }
    TD_CHECK_EQ(remote_num_local(1), 1);
    TD_CHECK_EQ(remote_num_local(2), 1);

    double want_losses[STEPS];
    td_tensor *want[NPARAMS];
    reference(&d, kind, o, lr_decay, want_losses, want);
    for (int step = 0; step < STEPS; step++)
        TD_CHECK_MSG(fabs(losses[step] - want_losses[step]) <= 1e-6, "%s: loss of step %d: %.12g, reference %.12g",
                     what, step, losses[step], want_losses[step]);
    TD_CHECK_MSG(want_losses[STEPS - 1] < want_losses[0], "%s: the reference did not learn", what);
    for (int i = 0; i < NPARAMS; i++) {
        td_value *v = NULL;
        TD_CHECK_OK(td_rref_to_here(params[i], -1, &v));
        td_tensor *got = tensor_arg(v);
        TD_CHECK(got != NULL);
        TD_CHECK_MSG(!td_tensor_allclose(got, d.init[i], 0, 1e-3, false), "%s: parameter %d did not move", what, i);
        TD_CHECK_MSG(td_tensor_allclose(got, want[i], 0, 1e-6, false),
                     "%s: parameter %d differs from the reference", what, i);
        td_value_release(v);
        td_tensor_release(want[i]);
    }
    td_dist_optimizer_free(opt);
    TD_CHECK_EQ(remote_num_local(1), 0);
    TD_CHECK_EQ(remote_num_local(2), 0);
    for (int i = 0; i < NPARAMS; i++)
        td_rref_release(params[i]);
    data_free(&d);
}

TD_TEST(sgd_momentum_matches_reference, .world_size = 3, .timeout_s = 60)
{
    dopt_up(ctx);
    if (ctx->rank == 0) {
        td_optim_options o = td_optim_options_default();
        o.lr = 0.1;
        o.momentum = 0.9;
        o.dampening = 0.1;
        o.weight_decay = 0.01;
        train_and_compare(TD_OPTIM_SGD, &o, 0.3, "SGD with momentum, lr x0.3 half-way");
        o = td_optim_options_default();
        o.lr = 0.05;
        o.momentum = 0.8;
        o.nesterov = true;
        train_and_compare(TD_OPTIM_SGD, &o, 1.0, "SGD with Nesterov momentum");
    }
    dopt_down();
}

TD_TEST(adam_matches_reference, .world_size = 3, .timeout_s = 60)
{
    dopt_up(ctx);
    if (ctx->rank == 0) {
        td_optim_options o = td_optim_options_default();
        o.lr = 0.05;
        o.weight_decay = 0.01;
        train_and_compare(TD_OPTIM_ADAM, &o, 0.5, "Adam, lr x0.5 half-way");
    }
    dopt_down();
}

/* A parameter that got no gradient in the context is left alone (PyTorch skips a .grad of None);
 * the options are checked with PyTorch's messages. */
TD_TEST(no_gradient_and_option_errors, .world_size = 2, .timeout_s = 60)
{
    dopt_up(ctx);
    if (ctx->rank == 0) {
        dopt_data d;
        data_make(&d);
        td_rref *w = NULL;
        td_value *args = td_value_tuple_of(1, td_value_tensor(d.init[0]));
        TD_CHECK_OK(td_rpc_remote(NULL, td_rpc_to_id(1), "dopt_param", args, NULL, -1, &w));
        td_value_release(args);
        td_optim_options o = td_optim_options_default();
        o.momentum = 0.9;
        td_dist_optimizer *opt = NULL;
        TD_CHECK_OK(td_dist_optimizer_create(TD_OPTIM_SGD, &o, &w, 1, &opt));
        int64_t id = -1;
        TD_CHECK_OK(td_dist_autograd_context_enter(NULL, &id));
        TD_CHECK_EQ(remote_num_local(1), 0); /* a call in the context: worker1 has it now */
        TD_CHECK_OK(td_dist_optimizer_step(opt, id));
        TD_CHECK_EQ(remote_num_local(1), 1);
        TD_CHECK_OK(td_dist_autograd_context_exit(id));
        td_value *v = NULL;
        TD_CHECK_OK(td_rref_to_here(w, -1, &v));
        TD_CHECK(tensor_arg(v) && td_tensor_equal(tensor_arg(v), d.init[0]));
        td_value_release(v);
        TD_CHECK_ERR(td_dist_optimizer_step(opt, 100), TD_ERR_REMOTE, "Could not find autograd context with id: 100");
        TD_CHECK_ERR(td_dist_optimizer_set_lr(opt, -0.5), TD_ERR_INVALID, "Invalid learning rate: -0.5");
        TD_CHECK_ERR(td_dist_optimizer_set_lr(NULL, 0.5), TD_ERR_INVALID, "opt is NULL");
        TD_CHECK(td_dist_optimizer_lr(opt) == o.lr); /* unchanged by the refused value */
        td_dist_optimizer_free(opt);
        td_rref_release(w);
        data_free(&d);

        td_dist_optimizer *bad = NULL;
        o = td_optim_options_default();
        o.lr = -1;
        TD_CHECK_ERR(td_dist_optimizer_create(TD_OPTIM_SGD, &o, NULL, 0, &bad), TD_ERR_INVALID,
                     "Invalid learning rate: -1");
        o = td_optim_options_default();
        o.momentum = -1;
        TD_CHECK_ERR(td_dist_optimizer_create(TD_OPTIM_SGD, &o, NULL, 0, &bad), TD_ERR_INVALID,
                     "Invalid momentum value: -1");
        o = td_optim_options_default();
        o.nesterov = true;
        TD_CHECK_ERR(td_dist_optimizer_create(TD_OPTIM_SGD, &o, NULL, 0, &bad), TD_ERR_INVALID,
                     "Nesterov momentum requires a momentum and zero dampening");
        o = td_optim_options_default();
        o.betas[0] = 1.0;
        TD_CHECK_ERR(td_dist_optimizer_create(TD_OPTIM_ADAM, &o, NULL, 0, &bad), TD_ERR_INVALID,
                     "Invalid beta parameter at index 0: 1");
        o = td_optim_options_default();
        o.eps = -1;
        TD_CHECK_ERR(td_dist_optimizer_create(TD_OPTIM_ADAM, &o, NULL, 0, &bad), TD_ERR_INVALID,
                     "Invalid epsilon value: -1");
        o = td_optim_options_default();
        o.weight_decay = -1;
        TD_CHECK_ERR(td_dist_optimizer_create(TD_OPTIM_ADAM, &o, NULL, 0, &bad), TD_ERR_INVALID,
                     "Invalid weight_decay value: -1");
        TD_CHECK(bad == NULL);
    }
    dopt_down();
}

TD_TEST_MAIN()
