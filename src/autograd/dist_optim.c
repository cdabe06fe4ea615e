/* The DistributedOptimizer (tdist/dist_optim.h): torch.distributed.optim.DistributedOptimizer over
 * the RPC call path.
 *
 * The trainer's side (td_dist_optimizer) keeps the parameter RRefs grouped by owner. A step sends
 * tdist::dist_optim_step(optimizer id, kind, options, params or None, context id) to every owner
 * at once (the RRefs travel only until the owner has made its local optimizer) and then waits for
 * all of them. The owner's side is PyTorch's _LocalOptimizer: a table of local optimizers keyed by
 * (agent, optimizer id), each with its parameters (the owners' tensors, retained) and their state,
 * under its own lock so that steps of one optimizer from several trainers run one at a time. An
 * owner reads each parameter's gradient in the step's context (dist_ag_gradient_on: its own copy of
 * the context) and updates the parameter's memory in place with PyTorch's SGD or Adam formulas, in
 * double precision. tdist::dist_optim_free drops a local optimizer. The calls are internal
 * (dist_ag_call_plain): they carry no autograd context, so a step made inside a context records
 * nothing. */
#include <math.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/autograd.h>
#include <tdist/dist_optim.h>

#include "autograd/dist_autograd_impl.h"
#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "base/map.h"
#include "base/ref.h"
#include "base/vec.h"
#include "rpc/rref.h"

#define DIST_OPTIM_STEP_FN "tdist::dist_optim_step"
#define DIST_OPTIM_FREE_FN "tdist::dist_optim_free"

/* ---- the owner's side: local optimizers ----------------------------------------------------------- */

typedef struct dist_optim_key {
    td_rpc_agent *agent; /* compared only */
    int64_t id;
} dist_optim_key;

typedef struct dist_optim_param {
    td_tensor *param; /* retained */
    double *first;    /* SGD's momentum buffer, Adam's exp_avg (NULL until the first update) */
    double *second;   /* Adam's exp_avg_sq */
    int64_t step;
} dist_optim_param;

typedef struct dist_optim_local {
    td_ref ref; /* the table's, and each step's while it runs */
    dist_optim_key key;
    td_optim_kind kind;
    td_optim_options options;
    pthread_mutex_t mu; /* one step at a time */
    size_t n;
    dist_optim_param *params;
} dist_optim_local;

static pthread_mutex_t dist_optim_locals_mu = PTHREAD_MUTEX_INITIALIZER;
static td_map dist_optim_locals = TD_MAP_INIT; /* dist_optim_key -> dist_optim_local */

static void dist_optim_local_release(dist_optim_local *l)
{
    if (!l || !ref_dec(&l->ref))
        return;
    for (size_t i = 0; i < l->n; i++) {
        td_tensor_release(l->params[i].param);
        free(l->params[i].first);
        free(l->params[i].second);
    }
    free(l->params);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

static td_status dist_optim_check_param(const td_tensor *t)
{
    td_dtype dt = td_tensor_dtype(t);
    if (!td_autograd_requires_grad(t) || !td_autograd_is_leaf(t))
        return error_fmt(TD_ERR_INVALID, "DistributedOptimizer: a parameter must be a leaf tensor that requires grad");
    if ((dt != TD_FLOAT32 && dt != TD_FLOAT64) || !td_tensor_is_contiguous(t))
        return error_fmt(TD_ERR_UNSUPPORTED,
                         "DistributedOptimizer: parameters must be contiguous float32 or float64 tensors");
    return TD_OK;
}

/* A local optimizer over the tensors the RRefs in list `params` hold (they are this worker's). */
static td_status dist_optim_local_new(td_rpc_agent *a, int64_t id, td_optim_kind kind, const td_optim_options *o,
                                      const td_value *params, dist_optim_local **out)
{
    dist_optim_local *l = TD_NEW(dist_optim_local);
    ref_init(&l->ref);
    l->key = (dist_optim_key){a, id};
    l->kind = kind;
    l->options = *o;
    pthread_mutex_init(&l->mu, NULL);
    size_t n = td_value_len(params);
    l->params = TD_NEW_ARRAY(dist_optim_param, n ? n : 1);
    td_status st = TD_OK;
    for (size_t i = 0; i < n && st == TD_OK; i++) {
        td_rref *r = td_value_get_rref(td_value_at(params, i));
        td_value *v = NULL;
        if (!r || !td_rref_is_owner(r)) {
            st = error_fmt(TD_ERR_INVALID, "%s: parameter %zu is not an RRef owned by this worker", DIST_OPTIM_STEP_FN,
                           i);
        } else if ((st = td_rref_local_value(r, &v)) == TD_OK) {
            if (!v || td_value_kind_of(v) != TD_VAL_TENSOR)
                st = error_fmt(TD_ERR_INVALID, "DistributedOptimizer: parameter RRefs must hold tensors");
            else if ((st = dist_optim_check_param(td_value_get_tensor(v))) == TD_OK)
                l->params[l->n++].param = td_tensor_retain(td_value_get_tensor(v));
        }
        td_value_release(v);
    }
    if (st != TD_OK) {
        dist_optim_local_release(l);
        return st;
    }
    *out = l;
    return TD_OK;
}

static double dist_optim_load(const void *data, td_dtype dt, int64_t i)
{
    return dt == TD_FLOAT32 ? (double)((const float *)data)[i] : ((const double *)data)[i];
}

static void dist_optim_store(void *data, td_dtype dt, int64_t i, double v)
{
    if (dt == TD_FLOAT32)
        ((float *)data)[i] = (float)v;
    else
        ((double *)data)[i] = v;
}

/* One parameter's update with gradient g (contiguous, same numel). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3"))) /* -O3 unswitches the option tests out of the element loops */
#endif
static td_status dist_optim_update(dist_optim_local *l, dist_optim_param *p, const td_tensor *g)
{
    const td_optim_options *o = &l->options;
    int64_t n = td_tensor_numel(p->param);
    td_dtype pt = td_tensor_dtype(p->param), gt = td_tensor_dtype(g);
    if (td_tensor_numel(g) != n || (gt != TD_FLOAT32 && gt != TD_FLOAT64))
        return error_fmt(TD_ERR_INVALID, "DistributedOptimizer: a gradient does not match its parameter");
    void *pd = td_tensor_data(p->param);
    const void *gd = td_tensor_data(g);
    bool first_update = p->first == NULL;
    bool need_first = l->kind == TD_OPTIM_ADAM || o->momentum != 0;
    if (first_update && need_first)
        p->first = calloc((size_t)(n ? n : 1), sizeof(double));
    if (l->kind == TD_OPTIM_ADAM && !p->second)
        p->second = calloc((size_t)(n ? n : 1), sizeof(double));
    if ((need_first && !p->first) || (l->kind == TD_OPTIM_ADAM && !p->second))
        return error_fmt(TD_ERR_NOMEM, "DistributedOptimizer: out of memory for the optimizer state");
    if (l->kind == TD_OPTIM_SGD && pt == TD_FLOAT32 && gt == TD_FLOAT32 && o->momentum != 0 && !first_update) {
        /* The common case (float32, momentum, state present), with the same arithmetic in loops
         * the compiler can vectorize: no per-element dtype or option tests, no aliasing. */
        float *restrict P = pd;
        const float *restrict G = gd;
        double *restrict B = p->first;
        double wd = o->weight_decay, mom = o->momentum, damp = 1 - o->dampening, lr = o->lr;
        for (int64_t i = 0; i < n; i++) {
            double param = P[i], d = G[i];
            if (wd != 0)
                d += wd * param;
            double buf = mom * B[i] + damp * d;
            B[i] = buf;
            d = o->nesterov ? d + mom * buf : buf;
            P[i] = (float)(param - lr * d);
        }
        return TD_OK;
    }
    if (l->kind == TD_OPTIM_SGD) {
        for (int64_t i = 0; i < n; i++) {
            double param = dist_optim_load(pd, pt, i), d = dist_optim_load(gd, gt, i);
            if (o->weight_decay != 0)
                d += o->weight_decay * param;
            if (o->momentum != 0) {
                double buf = first_update ? d : o->momentum * p->first[i] + (1 - o->dampening) * d;
                p->first[i] = buf;
                d = o->nesterov ? d + o->momentum * buf : buf;
            }
            dist_optim_store(pd, pt, i, param - o->lr * d);
        }
        return TD_OK;
    }
    p->step++;
    double bias1 = 1 - pow(o->betas[0], (double)p->step), bias2 = 1 - pow(o->betas[1], (double)p->step);
    double step_size = o->lr / bias1, bias2_sqrt = sqrt(bias2);
    for (int64_t i = 0; i < n; i++) {
        double param = dist_optim_load(pd, pt, i), d = dist_optim_load(gd, gt, i);
        if (o->weight_decay != 0)
            d += o->weight_decay * param;
        p->first[i] = o->betas[0] * p->first[i] + (1 - o->betas[0]) * d;
        p->second[i] = o->betas[1] * p->second[i] + (1 - o->betas[1]) * d * d;
        double denom = sqrt(p->second[i]) / bias2_sqrt + o->eps;
        dist_optim_store(pd, pt, i, param - step_size * p->first[i] / denom);
    }
    return TD_OK;
}

/* One step of l with the trainer's current learning rate (td_dist_optimizer_set_lr). */
static td_status dist_optim_local_step(td_rpc_agent *a, dist_optim_local *l, double lr, int64_t context_id)
{
    td_status st = TD_OK;
    pthread_mutex_lock(&l->mu);
    l->options.lr = lr;
    for (size_t i = 0; i < l->n && st == TD_OK; i++) {
        td_tensor *g = NULL, *gc = NULL;
        st = dist_ag_gradient_on(a, context_id, l->params[i].param, &g);
        if (st == TD_OK && g) /* no gradient in this context: skipped, as a .grad of None */
            st = td_tensor_contiguous(g, &gc);
        if (st == TD_OK && gc)
            st = dist_optim_update(l, &l->params[i], gc);
        td_tensor_release(gc);
        td_tensor_release(g);
    }
    pthread_mutex_unlock(&l->mu);
    return st;
}

/* The local optimizer of key (a new reference), or NULL. */
static dist_optim_local *dist_optim_local_get(const dist_optim_key *key)
{
    pthread_mutex_lock(&dist_optim_locals_mu);
    dist_optim_local *l = map_get(&dist_optim_locals, key, sizeof *key);
    if (l)
        ref_inc(&l->ref);
    pthread_mutex_unlock(&dist_optim_locals_mu);
    return l;
}

/* Under dist_optim_locals_mu: once the table is empty it holds no memory either. */
static void dist_optim_locals_trim(void)
{
    if (dist_optim_locals.len == 0)
        map_free(&dist_optim_locals, NULL);
}

static td_status dist_optim_options_from_value(const td_value *v, td_optim_options *o)
{
    if (!v || td_value_kind_of(v) != TD_VAL_TUPLE || td_value_len(v) != 8)
        return td_rpc_raise("TypeError", "%s: malformed options", DIST_OPTIM_STEP_FN);
    double f[8];
    for (size_t i = 0; i < 8; i++) {
        const td_value *e = td_value_at(v, i);
        if (i == 3) {
            if (td_value_kind_of(e) != TD_VAL_BOOL)
                return td_rpc_raise("TypeError", "%s: malformed options", DIST_OPTIM_STEP_FN);
            continue;
        }
        if (td_value_kind_of(e) != TD_VAL_DOUBLE)
            return td_rpc_raise("TypeError", "%s: malformed options", DIST_OPTIM_STEP_FN);
        f[i] = td_value_get_double(e);
    }
    *o = (td_optim_options){.lr = f[0],
                            .momentum = f[1],
                            .dampening = f[2],
                            .nesterov = td_value_get_bool(td_value_at(v, 3)),
                            .weight_decay = f[4],
                            .betas = {f[5], f[6]},
                            .eps = f[7]};
    return TD_OK;
}

/* tdist::dist_optim_step(id, kind, options, params, context_id): makes the local optimizer on
 * first use (params: a list of this worker's RRefs; None once it exists) and steps it. */
static td_status dist_optim_fn_step(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                    td_value **result)
{
    (void)result;
    const td_value *p[5];
    TD_TRY(td_rpc_bind(DIST_OPTIM_STEP_FN, "id,kind,options,params,context_id", args, kwargs, p));
    if (td_value_kind_of(p[0]) != TD_VAL_INT || td_value_kind_of(p[1]) != TD_VAL_INT ||
        td_value_kind_of(p[4]) != TD_VAL_INT ||
        (td_value_kind_of(p[3]) != TD_VAL_LIST && td_value_kind_of(p[3]) != TD_VAL_NONE))
        return td_rpc_raise("TypeError", "%s(int, int, tuple, list or None, int) got other types",
                            DIST_OPTIM_STEP_FN);
    int64_t kind = td_value_get_int(p[1]);
    if (kind != TD_OPTIM_SGD && kind != TD_OPTIM_ADAM)
        return td_rpc_raise("ValueError", "%s: unknown optimizer kind %lld", DIST_OPTIM_STEP_FN, (long long)kind);
    td_optim_options o;
    TD_TRY(dist_optim_options_from_value(p[2], &o));
    td_rpc_agent *a = td_rpc_call_agent(call);
    dist_optim_key key = {a, td_value_get_int(p[0])};
    /* The step holds its own reference: a trainer whose step timed out may free the optimizer
     * while this worker still runs the step. */
    dist_optim_local *l = dist_optim_local_get(&key);
    if (!l) {
        if (td_value_kind_of(p[3]) != TD_VAL_LIST)
            return td_rpc_raise("RuntimeError", "%s: no local optimizer %lld on this worker", DIST_OPTIM_STEP_FN,
                                (long long)key.id);
        dist_optim_local *fresh = NULL;
        TD_TRY(dist_optim_local_new(a, key.id, (td_optim_kind)kind, &o, p[3], &fresh));
        pthread_mutex_lock(&dist_optim_locals_mu);
        l = map_get(&dist_optim_locals, &key, sizeof key);
        if (!l) {
            map_put(&dist_optim_locals, &key, sizeof key, fresh);
            l = fresh;
            fresh = NULL;
        }
        ref_inc(&l->ref);
        pthread_mutex_unlock(&dist_optim_locals_mu);
        dist_optim_local_release(fresh);
    }
    td_status st = dist_optim_local_step(a, l, o.lr, td_value_get_int(p[4]));
    dist_optim_local_release(l);
    return st;
}

/* tdist::dist_optim_free(id): drops this worker's local optimizer of that id, if any. */
static td_status dist_optim_fn_free(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                    td_value **result)
{
    (void)result;
    const td_value *p[1];
    TD_TRY(td_rpc_bind(DIST_OPTIM_FREE_FN, "id", args, kwargs, p));
    if (td_value_kind_of(p[0]) != TD_VAL_INT)
        return td_rpc_raise("TypeError", "%s(int) got another type", DIST_OPTIM_FREE_FN);
    dist_optim_key key = {td_rpc_call_agent(call), td_value_get_int(p[0])};
    pthread_mutex_lock(&dist_optim_locals_mu);
    dist_optim_local *l = map_remove(&dist_optim_locals, &key, sizeof key);
    dist_optim_locals_trim();
    pthread_mutex_unlock(&dist_optim_locals_mu);
    dist_optim_local_release(l);
    return TD_OK;
}

void dist_optim_agent_free(td_rpc_agent *a)
{
    TD_VEC(dist_optim_local *) gone = {0};
    pthread_mutex_lock(&dist_optim_locals_mu);
    size_t it = 0;
    for (td_map_entry *e; (e = map_next(&dist_optim_locals, &it));) {
        dist_optim_local *l = e->value;
        if (l->key.agent == a)
            TD_VEC_PUSH(&gone, l);
    }
    for (size_t i = 0; i < gone.len; i++)
        map_remove(&dist_optim_locals, &gone.items[i]->key, sizeof gone.items[i]->key);
    dist_optim_locals_trim();
    pthread_mutex_unlock(&dist_optim_locals_mu);
    for (size_t i = 0; i < gone.len; i++)
        dist_optim_local_release(gone.items[i]);
    TD_VEC_FREE(&gone);
}

size_t dist_optim_local_count(void)
{
    pthread_mutex_lock(&dist_optim_locals_mu);
    size_t n = dist_optim_locals.len;
    pthread_mutex_unlock(&dist_optim_locals_mu);
    return n;
}

void dist_optim_register_functions(void)
{
    td_rpc_register(DIST_OPTIM_STEP_FN, dist_optim_fn_step, NULL);
    td_rpc_register(DIST_OPTIM_FREE_FN, dist_optim_fn_free, NULL);
}

/* ---- the trainer's side ------------------------------------------------------------------------- */

typedef struct dist_optim_owner {
    int64_t worker;
    bool created; /* its local optimizer exists */
    TD_VEC(td_rref *) params;
} dist_optim_owner;

struct td_dist_optimizer {
    td_rpc_agent *agent; /* borrowed from the RRefs, which hold it */
    int64_t id;
    td_optim_kind kind;
    td_optim_options options;
    TD_VEC(dist_optim_owner) owners;
};

static _Atomic int64_t dist_optim_next_id;

td_optim_options td_optim_options_default(void)
{
    return (td_optim_options){.lr = 1e-3, .betas = {0.9, 0.999}, .eps = 1e-8};
}

static td_status dist_optim_check_options(td_optim_kind kind, const td_optim_options *o)
{
    if (!(o->lr >= 0))
        return error_fmt(TD_ERR_INVALID, "Invalid learning rate: %g", o->lr);
    if (!(o->weight_decay >= 0))
        return error_fmt(TD_ERR_INVALID, "Invalid weight_decay value: %g", o->weight_decay);
    if (kind == TD_OPTIM_SGD) {
        if (!(o->momentum >= 0))
            return error_fmt(TD_ERR_INVALID, "Invalid momentum value: %g", o->momentum);
        if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
            return error_fmt(TD_ERR_INVALID, "Nesterov momentum requires a momentum and zero dampening");
        return TD_OK;
    }
    if (kind != TD_OPTIM_ADAM)
        return error_fmt(TD_ERR_INVALID, "td_dist_optimizer_create: unknown optimizer kind %d", (int)kind);
    if (!(o->eps >= 0))
        return error_fmt(TD_ERR_INVALID, "Invalid epsilon value: %g", o->eps);
    for (int i = 0; i < 2; i++)
        if (!(o->betas[i] >= 0 && o->betas[i] < 1))
            return error_fmt(TD_ERR_INVALID, "Invalid beta parameter at index %d: %g", i, o->betas[i]);
    return TD_OK;
}

td_status td_dist_optimizer_create(td_optim_kind kind, const td_optim_options *options, td_rref *const *params,
                                   size_t n, td_dist_optimizer **opt)
{
    if (!opt || !options || (n && !params))
        return error_fmt(TD_ERR_INVALID, "td_dist_optimizer_create: options, params and opt must not be NULL");
    *opt = NULL;
    TD_TRY(dist_optim_check_options(kind, options));
    td_rpc_agent *agent = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!params[i])
            return error_fmt(TD_ERR_INVALID, "td_dist_optimizer_create: parameter %zu is NULL", i);
        if (i > 0 && rpc_rref_agent(params[i]) != agent)
            return error_fmt(TD_ERR_INVALID, "td_dist_optimizer_create: the RRefs belong to different agents");
        agent = rpc_rref_agent(params[i]);
    }
    td_dist_optimizer *o = TD_NEW(td_dist_optimizer);
    o->agent = agent;
    o->kind = kind;
    o->options = *options;
    for (size_t i = 0; i < n; i++) {
        td_worker_info owner;
        td_status st = td_rref_owner(params[i], &owner);
        if (st != TD_OK) {
            td_dist_optimizer_free(o);
            return st;
        }
        size_t k = 0;
        while (k < o->owners.len && o->owners.items[k].worker != owner.id)
            k++;
        if (k == o->owners.len)
            TD_VEC_PUSH(&o->owners, ((dist_optim_owner){.worker = owner.id}));
        TD_VEC_PUSH(&o->owners.items[k].params, td_rref_retain(params[i]));
    }
    int64_t self = 0;
    if (agent) {
        td_worker_info info;
        if (td_rpc_worker_info(agent, NULL, &info) == TD_OK)
            self = info.id;
    }
    o->id = (self << 48) | atomic_fetch_add(&dist_optim_next_id, 1);
    *opt = o;
    return TD_OK;
}

static td_value *dist_optim_options_value(const td_optim_options *o)
{
    return td_value_tuple_of(8, td_value_double(o->lr), td_value_double(o->momentum), td_value_double(o->dampening),
                             td_value_bool(o->nesterov), td_value_double(o->weight_decay), td_value_double(o->betas[0]),
                             td_value_double(o->betas[1]), td_value_double(o->eps));
}

td_status td_dist_optimizer_step(td_dist_optimizer *opt, int64_t context_id)
{
    if (!opt)
        return error_fmt(TD_ERR_INVALID, "td_dist_optimizer_step: opt is NULL");
    size_t n = opt->owners.len;
    td_future **fs = TD_NEW_ARRAY(td_future *, n ? n : 1);
    td_status st = TD_OK;
    char msg[TD_ERROR_MAX] = "";
    for (size_t k = 0; k < n; k++) {
        dist_optim_owner *w = &opt->owners.items[k];
        /* The RRefs travel until the owner has made its local optimizer. */
        td_value *params = w->created ? td_value_none() : td_value_list_new();
        for (size_t i = 0; !w->created && i < w->params.len; i++)
            td_value_list_append(params, td_rref_value(w->params.items[i]));
        td_value *args = td_value_tuple_of(5, td_value_int(opt->id), td_value_int(opt->kind),
                                           dist_optim_options_value(&opt->options), params, td_value_int(context_id));
        td_status cs = dist_ag_call_plain(opt->agent, (int)w->worker, DIST_OPTIM_STEP_FN, args, &fs[k]);
        td_value_release(args);
        if (cs != TD_OK && st == TD_OK) { /* fs[k] stays NULL */
            st = cs;
            snprintf(msg, sizeof msg, "%s", td_last_error());
        }
    }
    for (size_t k = 0; k < n; k++) {
        if (!fs[k])
            continue;
        td_status fst = td_future_wait(fs[k], 0);
        if (fst == TD_OK) {
            opt->owners.items[k].created = true;
        } else if (st == TD_OK) {
            st = fst;
            snprintf(msg, sizeof msg, "%s", td_future_error(fs[k]));
        }
        td_future_release(fs[k]);
    }
    free(fs);
    return st == TD_OK ? TD_OK : error_set(st, msg);
}

td_status td_dist_optimizer_set_lr(td_dist_optimizer *opt, double lr)
{
    if (!opt)
        return error_fmt(TD_ERR_INVALID, "td_dist_optimizer_set_lr: opt is NULL");
    if (!(lr >= 0))
        return error_fmt(TD_ERR_INVALID, "Invalid learning rate: %g", lr);
    opt->options.lr = lr;
    return TD_OK;
}

double td_dist_optimizer_lr(const td_dist_optimizer *opt) { return opt ? opt->options.lr : 0; }

void td_dist_optimizer_free(td_dist_optimizer *opt)
{
    if (!opt)
        return;
    size_t n = opt->owners.len;
    td_future **fs = TD_NEW_ARRAY(td_future *, n ? n : 1);
    td_value *args = td_value_tuple_of(1, td_value_int(opt->id));
    /* Every owner, stepped or not: a first step that failed may have made its local optimizer. A
     * call that fails to start leaves fs[k] NULL. */
    for (size_t k = 0; k < n; k++)
        dist_ag_call_plain(opt->agent, (int)opt->owners.items[k].worker, DIST_OPTIM_FREE_FN, args, &fs[k]);
    for (size_t k = 0; k < n; k++) {
        if (fs[k] && td_future_wait(fs[k], 0) != TD_OK)
            TD_LOG_DEBUG("DistributedOptimizer: dropping the local optimizer on worker %lld: %s",
                         (long long)opt->owners.items[k].worker, td_future_error(fs[k]));
        td_future_release(fs[k]);
    }
    td_value_release(args);
    free(fs);
    for (size_t k = 0; k < n; k++) {
        for (size_t i = 0; i < opt->owners.items[k].params.len; i++)
            td_rref_release(opt->owners.items[k].params.items[i]);
        TD_VEC_FREE(&opt->owners.items[k].params);
    }
    TD_VEC_FREE(&opt->owners);
    free(opt);
}
