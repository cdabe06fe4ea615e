/* Distributed autograd (tdist/dist_autograd.h) across real worker processes: backward through
 * chains of 2 and 3 workers (worker0 -> worker1 -> worker2) and through a nested call back to the
 * caller, each checked against the same computation run by the local engine in one process;
 * retain_graph accumulation (two passes give twice the gradients, on every worker); two contexts
 * used at once from two threads of one worker; the unknown-context and root errors; context
 * cleanup on every worker the context reached; and a worker killed in the middle of a backward,
 * which fails the pass on the caller with TD_ERR_PEER_LOST naming it.
 *
 * RRef backward (test_owner_rref_backward, test_user_rref_backward): the owner's local and
 * distributed backward, the owner's backward asked for through a user RRef, and their errors.
 *
 * Every worker holds a leaf param = full(N, 0.5 + rank); its functions use it, so the callees'
 * leaves get gradients that the caller reads back with dag_param_grad(context). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <tdist/autograd.h>
#include <tdist/dist_autograd.h>
#include <tdist/profiler.h>
#include <tdist/rref.h>
#include <tdist/rpc.h>
#include <tdist/testing.h>

#include "rpc_util.h"

enum { N = 3 };

static td_tensor *g_param; /* this worker's leaf */

static td_tensor *full(double v)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT64, TD_SHAPE(N, N), v, &t));
    return t;
}

static td_tensor *leaf(double v)
{
    td_tensor *t = full(v);
    TD_CHECK_OK(td_autograd_set_requires_grad(t, true));
    return t;
}

static double param_value(int64_t rank) { return 0.5 + (double)rank; }

/* ---- the functions workers call -------------------------------------------------------------- */

/* dag_param_mul(z): z * param. */
static td_status fn_param_mul(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[1];
    if (td_rpc_bind("dag_param_mul", "z", args, kwargs, p) != TD_OK)
        return TD_ERR_REMOTE;
    td_tensor *out = NULL;
    td_status st = td_autograd_mul(td_value_get_tensor(p[0]), g_param, &out);
    if (st != TD_OK)
        return st;
    *result = td_value_tensor(out);
    td_tensor_release(out);
    return TD_OK;
}

/* dag_hop(x, y, dst): z = x * y; w = dag_param_mul(z) on worker dst (a nested call); w + y. */
static td_status fn_hop(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[3];
    if (td_rpc_bind("dag_hop", "x,y,dst", args, kwargs, p) != TD_OK)
        return TD_ERR_REMOTE;
    td_tensor *x = td_value_get_tensor(p[0]), *y = td_value_get_tensor(p[1]), *z = NULL, *out = NULL;
    td_status st = td_autograd_mul(x, y, &z);
    if (st != TD_OK)
        return st;
    td_value *a = td_value_tuple_of(1, td_value_tensor(z)), *w = NULL;
    st = td_rpc_sync(NULL, td_rpc_to_id(td_value_get_int(p[2])), "dag_param_mul", a, NULL,
                               TD_RPC_DEFAULT_TIMEOUT, &w);
    if (st == TD_OK)
        st = td_autograd_add(td_value_get_tensor(w), y, &out);
    td_value_release(a);
    td_value_release(w);
    td_tensor_release(z);
    if (st != TD_OK)
        return st;
    *result = td_value_tensor(out);
    td_tensor_release(out);
    return TD_OK;
}

/* dag_add(a, b): a + b, recorded (torch.add on the callee). */
static td_status fn_add(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[2];
    if (td_rpc_bind("dag_add", "a,b", args, kwargs, p) != TD_OK)
        return TD_ERR_REMOTE;
    td_tensor *out = NULL;
    td_status st = td_autograd_add(td_value_get_tensor(p[0]), td_value_get_tensor(p[1]), &out);
    if (st != TD_OK)
        return st;
    *result = td_value_tensor(out);
    td_tensor_release(out);
    return TD_OK;
}

/* dag_sum(t): t.sum(), recorded (the seed's _sum). */
static td_status fn_sum(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[1];
    if (td_rpc_bind("dag_sum", "t", args, kwargs, p) != TD_OK)
        return TD_ERR_REMOTE;
    td_tensor *out = NULL;
    td_status st = td_autograd_sum(td_value_get_tensor(p[0]), &out);
    if (st != TD_OK)
        return st;
    *result = td_value_tensor(out);
    td_tensor_release(out);
    return TD_OK;
}

/* dag_foo(): "foo". */
static td_status fn_foo(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    *result = td_value_string("foo");
    return TD_OK;
}

/* dag_param_grad(context_id): this worker's param gradient in that context, or None. */
static td_status fn_param_grad(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[1];
    if (td_rpc_bind("dag_param_grad", "context_id", args, kwargs, p) != TD_OK)
        return TD_ERR_REMOTE;
    td_tensor *g = NULL;
    td_status st = td_dist_autograd_get_gradient(td_value_get_int(p[0]), g_param, &g);
    if (st != TD_OK)
        return st;
    if (g) {
        *result = td_value_tensor(g);
        td_tensor_release(g);
    }
    return TD_OK;
}

/* dag_num_contexts(): this worker's num_autograd_contexts. */
static td_status fn_num_contexts(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    *result = td_value_int(rpc_test_debug_int("num_autograd_contexts"));
    return TD_OK;
}

/* A hook on worker2's param that kills the worker when its gradient arrives (killed_mid_backward). */
static td_status kill_hook(td_tensor *grad, void *ctx, td_tensor **replace)
{
    (void)grad;
    (void)ctx;
    (void)replace;
    raise(SIGKILL);
    return TD_OK;
}

/* dag_kill(): the callee dies at once (creator_killed). */
static td_status fn_kill(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    (void)result;
    raise(SIGKILL);
    return TD_OK;
}

static void dag_up(td_test_ctx *ctx)
{
    const rpc_test_function fns[] = {{"dag_param_mul", fn_param_mul, NULL, NULL},
                                     {"dag_hop", fn_hop, NULL, NULL},
                                     {"dag_param_grad", fn_param_grad, NULL, NULL},
                                     {"dag_num_contexts", fn_num_contexts, NULL, NULL},
                                     {"dag_add", fn_add, NULL, NULL},
                                     {"dag_sum", fn_sum, NULL, NULL},
                                     {"dag_foo", fn_foo, NULL, NULL},
                                     {"dag_kill", fn_kill, NULL, NULL}};
    rpc_test_register(fns, sizeof fns / sizeof fns[0]);
    g_param = leaf(param_value(ctx->rank));
    rpc_test_init(ctx, NULL);
}

/* Every worker: no context left anywhere, then shutdown. */
static void dag_down(void)
{
    TD_CHECK_OK(td_rpc_barrier(NULL, NULL, 0, 30000));
    rpc_test_wait_debug("num_autograd_contexts", 0, 10000);
    TD_CHECK_EQ(rpc_test_debug_int("num_current_backward_passes"), 0);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
    td_tensor_release(g_param);
    g_param = NULL;
}

static void check_close(const td_tensor *got, const td_tensor *want, const char *what)
{
    TD_CHECK_MSG(got != NULL, "%s: no gradient", what);
    TD_CHECK_MSG(want != NULL, "%s: no reference gradient", what);
    TD_CHECK_MSG(td_tensor_allclose(got, want, 1e-12, 1e-12, false), "%s: the gradient differs from the local one",
                 what);
}

static td_tensor *remote_param_grad(int64_t worker, int64_t context_id)
{
    td_value *args = td_value_tuple_of(1, td_value_int(context_id)), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(worker), "dag_param_grad", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    td_value_release(args);
    TD_CHECK_MSG(r && td_value_kind_of(r) == TD_VAL_TENSOR, "worker%lld has no param gradient", (long long)worker);
    td_tensor *g = td_tensor_retain(td_value_get_tensor(r));
    td_value_release(r);
    return g;
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

static td_tensor *local_grad(td_tensor *t)
{
    td_tensor *g = td_autograd_get_grad(t);
    TD_CHECK(g != NULL);
    return g;
}

/* ---- chains ------------------------------------------------------------------------------------ */

/* chain2: loss = sum(x * y * param1 + x), param_mul on worker1. Returns the loss (requires grad). */
static td_tensor *chain2_forward(td_tensor *x, td_tensor *y, bool remote, td_tensor *local_param)
{
    td_tensor *xy = NULL, *w = NULL, *s = NULL, *loss = NULL;
    TD_CHECK_OK(td_autograd_mul(x, y, &xy));
    if (remote)
        w = call_tensor(1, "dag_param_mul", td_value_tuple_of(1, td_value_tensor(xy)));
    else
        TD_CHECK_OK(td_autograd_mul(xy, local_param, &w));
    TD_CHECK(td_autograd_requires_grad(w));
    TD_CHECK_OK(td_autograd_add(w, x, &s));
    TD_CHECK_OK(td_autograd_sum(s, &loss));
    td_tensor_release(xy);
    td_tensor_release(w);
    td_tensor_release(s);
    return loss;
}

/* The gradients of chain2 by the local engine, times `times`. */
static void chain2_reference(double times, td_tensor **gx, td_tensor **gy, td_tensor **gp)
{
    td_tensor *x = leaf(1.5), *y = leaf(-2.0), *p = leaf(param_value(1));
    td_tensor *loss = chain2_forward(x, y, false, p);
    TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
    td_tensor *gs[3] = {local_grad(x), local_grad(y), local_grad(p)};
    td_tensor **outs[3] = {gx, gy, gp};
    for (int i = 0; i < 3; i++) {
        TD_CHECK_OK(td_autograd_mul_scalar(gs[i], times, outs[i]));
        td_tensor_release(gs[i]);
    }
    td_tensor_release(loss);
    td_tensor_release(x);
    td_tensor_release(y);
    td_tensor_release(p);
}

TD_TEST(chain_of_two_workers, .world_size = 2, .timeout_s = 60)
{
    dag_up(ctx);
    if (ctx->rank == 0) {
        td_tensor *x = leaf(1.5), *y = leaf(-2.0);
        int64_t id = -1;
        TD_CHECK_OK(td_dist_autograd_context_enter(NULL, &id));
        TD_CHECK_EQ(id >> 48, 0);
        TD_CHECK_EQ(td_dist_autograd_current_context(), id);
        td_tensor *loss = chain2_forward(x, y, true, NULL);
        TD_CHECK_OK(td_dist_autograd_backward(id, &loss, 1, false));
        td_tensor *gx, *gy, *gp, *rx, *ry, *rp;
        TD_CHECK_OK(td_dist_autograd_get_gradient(id, x, &gx));
        TD_CHECK_OK(td_dist_autograd_get_gradient(id, y, &gy));
        gp = remote_param_grad(1, id);
        chain2_reference(1, &rx, &ry, &rp);
        check_close(gx, rx, "x");
        check_close(gy, ry, "y");
        check_close(gp, rp, "worker1's param");
        /* The gradients live in the context, not in .grad. */
        TD_CHECK(td_autograd_get_grad(x) == NULL);
        /* get_gradients lists this worker's two leaves. */
        td_tensor *ts[4] = {0}, *gs[4] = {0};
        size_t n = 0;
        TD_CHECK_OK(td_dist_autograd_get_gradients(id, ts, gs, 4, &n));
        TD_CHECK_EQ(n, 2);
        for (size_t i = 0; i < n; i++) {
            TD_CHECK(ts[i] == x || ts[i] == y);
            check_close(gs[i], ts[i] == x ? rx : ry, "get_gradients");
            td_tensor_release(ts[i]);
            td_tensor_release(gs[i]);
        }
        /* Both workers hold the context until it ends. */
        TD_CHECK_EQ(rpc_test_debug_int("num_autograd_contexts"), 1);
        td_value *r = NULL;
        TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(1), "dag_num_contexts", NULL, NULL, -1, &r));
        TD_CHECK_EQ(td_value_get_int(r), 1);
        td_value_release(r);
        TD_CHECK_OK(td_dist_autograd_context_exit(id));
        TD_CHECK_EQ(td_dist_autograd_current_context(), -1);
        td_tensor *all[] = {gx, gy, gp, rx, ry, rp, loss, x, y};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            td_tensor_release(all[i]);
    }
    dag_down();
}

/* chain3: loss = sum(dag_hop(x, y, dst) * x), dag_hop on worker1 calling param_mul on dst. */
static td_tensor *chain3_forward(td_tensor *x, td_tensor *y, int64_t dst)
{
    td_tensor *h = call_tensor(1, "dag_hop",
                               td_value_tuple_of(3, td_value_tensor(x), td_value_tensor(y), td_value_int(dst)));
    td_tensor *m = NULL, *loss = NULL;
    TD_CHECK_OK(td_autograd_mul(h, x, &m));
    TD_CHECK_OK(td_autograd_sum(m, &loss));
    td_tensor_release(h);
    td_tensor_release(m);
    return loss;
}

static void chain3_reference(int64_t dst, td_tensor **gx, td_tensor **gy, td_tensor **gp)
{
    td_tensor *x = leaf(1.5), *y = leaf(-2.0), *p = leaf(param_value(dst));
    td_tensor *z = NULL, *w = NULL, *h = NULL, *m = NULL, *loss = NULL;
    TD_CHECK_OK(td_autograd_mul(x, y, &z));
    TD_CHECK_OK(td_autograd_mul(z, p, &w));
    TD_CHECK_OK(td_autograd_add(w, y, &h));
    TD_CHECK_OK(td_autograd_mul(h, x, &m));
    TD_CHECK_OK(td_autograd_sum(m, &loss));
    TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
    *gx = local_grad(x);
    *gy = local_grad(y);
    *gp = local_grad(p);
    td_tensor *all[] = {x, y, p, z, w, h, m, loss};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_tensor_release(all[i]);
}

/* worker0 -> worker1 -> dst and back: backward crosses every hop. */
static void run_chain3(int64_t dst)
{
    td_tensor *x = leaf(1.5), *y = leaf(-2.0);
    int64_t id = -1;
    TD_CHECK_OK(td_dist_autograd_context_enter(NULL, &id));
    td_tensor *loss = chain3_forward(x, y, dst);
    TD_CHECK_OK(td_dist_autograd_backward(id, &loss, 1, false));
    td_tensor *gx, *gy, *gp, *rx, *ry, *rp;
    TD_CHECK_OK(td_dist_autograd_get_gradient(id, x, &gx));
    TD_CHECK_OK(td_dist_autograd_get_gradient(id, y, &gy));
    if (dst == 0)
        TD_CHECK_OK(td_dist_autograd_get_gradient(id, g_param, &gp));
    else
        gp = remote_param_grad(dst, id);
    chain3_reference(dst, &rx, &ry, &rp);
    check_close(gx, rx, "x");
    check_close(gy, ry, "y");
    check_close(gp, rp, "the param of the last hop");
    /* worker1's own param took no part: no gradient there. */
    td_value *args = td_value_tuple_of(1, td_value_int(id)), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(1), "dag_param_grad", args, NULL, -1, &r));
    TD_CHECK(r == NULL || td_value_kind_of(r) == TD_VAL_NONE);
    td_value_release(r);
    td_value_release(args);
    TD_CHECK_OK(td_dist_autograd_context_exit(id));
    td_tensor *all[] = {gx, gy, gp, rx, ry, rp, loss, x, y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_tensor_release(all[i]);
}

TD_TEST(chain_of_three_workers, .world_size = 3, .timeout_s = 60)
{
    dag_up(ctx);
    if (ctx->rank == 0)
        run_chain3(2);
    dag_down();
}

/* The nested call goes back to the caller: worker0 -> worker1 -> worker0, one context on worker0
 * serving as both ends. */
TD_TEST(nested_call_back_to_caller, .world_size = 2, .timeout_s = 60)
{
    dag_up(ctx);
    if (ctx->rank == 0)
        run_chain3(0);
    dag_down();
}

/* Four workers: every one but worker0 holds the context after the forward; exit clears them all. */
TD_TEST(context_cleanup_everywhere, .world_size = 4, .timeout_s = 60)
{
    dag_up(ctx);
    if (ctx->rank == 0) {
        td_tensor *x = leaf(1.5), *y = leaf(-2.0);
        int64_t id = -1;
        TD_CHECK_OK(td_dist_autograd_context_enter(NULL, &id));
        td_tensor *loss = chain3_forward(x, y, 2); /* worker1 and worker2 */
        td_tensor *w3 = call_tensor(3, "dag_param_mul", td_value_tuple_of(1, td_value_tensor(x)));
        for (int w = 1; w < 4; w++) {
            td_value *r = NULL;
            TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(w), "dag_num_contexts", NULL, NULL, -1, &r));
            TD_CHECK_EQ(td_value_get_int(r), 1);
            td_value_release(r);
        }
        TD_CHECK_OK(td_dist_autograd_context_exit(id));
        TD_CHECK_EQ(rpc_test_debug_int("num_autograd_contexts"), 0);
        /* Released everywhere before exit returned (worker2 through worker1). */
        for (int w = 1; w < 4; w++) {
            td_value *r = NULL;
            TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(w), "dag_num_contexts", NULL, NULL, -1, &r));
            TD_CHECK_EQ(td_value_get_int(r), 0);
            td_value_release(r);
        }
        TD_CHECK_ERR(td_dist_autograd_backward(id, &loss, 1, false), TD_ERR_INVALID,
                     "Could not find autograd context with id:");
        td_tensor_release(w3);
        td_tensor_release(loss);
        td_tensor_release(x);
        td_tensor_release(y);
    }
    dag_down();
}

/* ---- retain_graph ------------------------------------------------------------------------------ */

TD_TEST(retain_graph_accumulates, .world_size = 2, .timeout_s = 60)
{
    dag_up(ctx);
    if (ctx->rank == 0) {
        td_tensor *x = leaf(1.5), *y = leaf(-2.0);
        int64_t id = -1;
        TD_CHECK_OK(td_dist_autograd_context_enter(NULL, &id));
        td_tensor *loss = chain2_forward(x, y, true, NULL);
        TD_CHECK_OK(td_dist_autograd_backward(id, &loss, 1, true));
        TD_CHECK_OK(td_dist_autograd_backward(id, &loss, 1, false));
        td_tensor *gx, *gy, *gp, *rx, *ry, *rp;
        TD_CHECK_OK(td_dist_autograd_get_gradient(id, x, &gx));
        TD_CHECK_OK(td_dist_autograd_get_gradient(id, y, &gy));
        gp = remote_param_grad(1, id);
        chain2_reference(2, &rx, &ry, &rp);
        check_close(gx, rx, "x, two passes");
        check_close(gy, ry, "y, two passes");
        check_close(gp, rp, "worker1's param, two passes");
        TD_CHECK_OK(td_dist_autograd_context_exit(id));
        td_tensor *all[] = {gx, gy, gp, rx, ry, rp, loss, x, y};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            td_tensor_release(all[i]);
    }
    dag_down();
}

/* ---- profiled calls and remote() ------------------------------------------------------------------ */

/* A call made under the profiler carries both wrappings (profiling and autograd) and gives the same
 * result; a remote() made in the context keeps a result that requires grad on its owner, and its
 * to_here, made in the context too, brings it back with a recv function: loss = sum(x * p1) through
 * both, so d/dx = 2 p1 and d/dp1 = 2 x. */
TD_TEST(profiled_and_remote_calls, .world_size = 2, .timeout_s = 60)
{
    dag_up(ctx);
    if (ctx->rank == 0) {
        td_tensor *x = leaf(1.5);
        int64_t id = -1;
        TD_CHECK_OK(td_dist_autograd_context_enter(NULL, &id));
        td_profiler *prof = NULL;
        TD_CHECK_OK(td_profiler_start(NULL, &prof));
        td_tensor *w1 = call_tensor(1, "dag_param_mul", td_value_tuple_of(1, td_value_tensor(x)));
        TD_CHECK_OK(td_profiler_stop(prof));
        td_profiler_event *events = NULL;
        size_t nevents = 0;
        TD_CHECK_OK(td_profiler_events(prof, &events, &nevents));
        TD_CHECK(nevents > 0);
        td_profiler_events_free(events);
        td_profiler_free(prof);
        td_value *args = td_value_tuple_of(1, td_value_tensor(x)), *v = NULL;
        td_rref *rref = NULL;
        TD_CHECK_OK(td_rpc_remote(NULL, td_rpc_to_id(1), "dag_param_mul", args, NULL, -1, &rref));
        TD_CHECK_OK(td_rref_to_here(rref, -1, &v));
        TD_CHECK(v && td_value_kind_of(v) == TD_VAL_TENSOR);
        td_tensor *w2 = td_value_get_tensor(v);
        TD_CHECK(td_autograd_requires_grad(w2));
        td_tensor *sum = NULL, *loss = NULL;
        TD_CHECK_OK(td_autograd_add(w1, w2, &sum));
        TD_CHECK_OK(td_autograd_sum(sum, &loss));
        TD_CHECK_OK(td_dist_autograd_backward(id, &loss, 1, false));
        td_tensor *gx = NULL, *gp = remote_param_grad(1, id), *wx = full(2 * param_value(1)), *wp = full(2 * 1.5);
        TD_CHECK_OK(td_dist_autograd_get_gradient(id, x, &gx));
        check_close(gx, wx, "x through a profiled call and an RRef");
        check_close(gp, wp, "worker1's param through a profiled call and an RRef");
        td_rref_release(rref);
        TD_CHECK_OK(td_dist_autograd_context_exit(id));
        td_tensor *all[] = {gx, gp, wx, wp, sum, loss, w1, x};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            td_tensor_release(all[i]);
        td_value_release(v);
        td_value_release(args);
    }
    dag_down();
}

/* ---- two contexts at once ---------------------------------------------------------------------- */

typedef struct dag_thread_arg {
    double scale;
    int64_t id;
    int ok;
} dag_thread_arg;

/* One thread's context: loss = sum(x * y * param1 + x) with x scaled, checked against the local
 * engine; the context stays open until the main thread checked both. */
static void *context_thread(void *p)
{
    dag_thread_arg *arg = p;
    td_tensor *x = leaf(1.5 * arg->scale), *y = leaf(-2.0);
    TD_CHECK_OK(td_dist_autograd_context_enter(NULL, &arg->id));
    for (int i = 0; i < 5; i++) {
        td_tensor *loss = chain2_forward(x, y, true, NULL);
        TD_CHECK_OK(td_dist_autograd_backward(arg->id, &loss, 1, false));
        td_tensor_release(loss);
    }
    td_tensor *gy = NULL;
    TD_CHECK_OK(td_dist_autograd_get_gradient(arg->id, y, &gy));
    /* d/dy sum(x*y*p + x) = x * p, five passes */
    td_tensor *want = full(5 * 1.5 * arg->scale * param_value(1));
    check_close(gy, want, "y in a thread's context");
    td_tensor_release(want);
    td_tensor_release(gy);
    td_tensor_release(x);
    td_tensor_release(y);
    arg->ok = 1;
    return NULL;
}

TD_TEST(concurrent_contexts_on_one_worker, .world_size = 2, .timeout_s = 60)
{
    dag_up(ctx);
    if (ctx->rank == 0) {
        dag_thread_arg args[2] = {{1.0, -1, 0}, {3.0, -1, 0}};
        pthread_t th[2];
        for (int i = 0; i < 2; i++)
            TD_CHECK(pthread_create(&th[i], NULL, context_thread, &args[i]) == 0);
        for (int i = 0; i < 2; i++)
            TD_CHECK(pthread_join(th[i], NULL) == 0);
        TD_CHECK(args[0].ok && args[1].ok);
        TD_CHECK(args[0].id != args[1].id);
        TD_CHECK_EQ(rpc_test_debug_int("num_autograd_contexts"), 2);
        /* worker1's param: d/dp = x * y per pass, five passes, per context. */
        for (int i = 0; i < 2; i++) {
            td_tensor *gp = remote_param_grad(1, args[i].id);
            td_tensor *want = full(5 * 1.5 * args[i].scale * -2.0);
            check_close(gp, want, "worker1's param in each context");
            td_tensor_release(gp);
            td_tensor_release(want);
        }
        /* The threads ended without leaving: another thread may end them. */
        for (int i = 0; i < 2; i++)
            TD_CHECK_OK(td_dist_autograd_context_exit(args[i].id));
    }
    dag_down();
}

/* ---- errors -------------------------------------------------------------------------------------- */

TD_TEST(errors, .world_size = 2, .timeout_s = 60)
{
    dag_up(ctx);
    if (ctx->rank == 0) {
        td_tensor *x = leaf(1.0), *plain = full(1.0), *s = NULL;
        TD_CHECK_ERR(td_dist_autograd_backward(100, &x, 1, false), TD_ERR_INVALID,
                     "Could not find autograd context with id: 100");
        td_tensor *g = NULL;
        TD_CHECK_ERR(td_dist_autograd_get_gradient(100, x, &g), TD_ERR_INVALID,
                     "Could not find autograd context with id: 100");
        size_t n = 0;
        TD_CHECK_ERR(td_dist_autograd_get_gradients(100, NULL, NULL, 0, &n), TD_ERR_INVALID,
                     "Could not find autograd context with id: 100");
        TD_CHECK_ERR(td_dist_autograd_context_exit(100), TD_ERR_INVALID, "Could not find autograd context with id: 100");
        int64_t id = -1, other = -1;
        TD_CHECK_OK(td_dist_autograd_context_enter(NULL, &id));
        TD_CHECK_ERR(td_dist_autograd_context_enter(NULL, &other), TD_ERR_INVALID,
                     "Already have an autograd context id for this thread.");
        TD_CHECK_ERR(td_dist_autograd_backward(id, &plain, 1, false), TD_ERR_INVALID,
                     "tensors does not require grad and does not have a grad_fn");
        TD_CHECK_ERR(td_dist_autograd_backward(id, &x, 1, false), TD_ERR_INVALID,
                     "grad can be implicitly created only for scalar outputs");
        /* A tensor received in a context needs the distributed backward. */
        td_tensor *w = call_tensor(1, "dag_param_mul", td_value_tuple_of(1, td_value_tensor(x)));
        TD_CHECK_OK(td_autograd_sum(w, &s));
        TD_CHECK_ERR(td_autograd_backward(s, NULL, false), TD_ERR_INVALID, "td_dist_autograd_backward");
        /* A gradient that reached no leaf of this worker: none, not an error. */
        TD_CHECK_OK(td_dist_autograd_get_gradient(id, plain, &g));
        TD_CHECK(g == NULL);
        TD_CHECK_OK(td_dist_autograd_context_exit(id));
        td_tensor_release(s);
        td_tensor_release(w);
        td_tensor_release(x);
        td_tensor_release(plain);
    }
    dag_down();
}

/* ---- RRef backward ---------------------------------------------------------------------------- */

static td_rref *owner_rref_of_tensor(td_tensor *t)
{
    td_value *v = td_value_tensor(t);
    td_rref *r = NULL;
    TD_CHECK_OK(td_rref_create(NULL, v, &r));
    td_value_release(v);
    return r;
}

/* test_owner_rref_backward: t1 = 10x10 leaf. RRef(t1.sum() + t1.sum()).backward() is the local
 * backward (t1.grad = 2); in a context, RRef(rpc_sync(worker1, add, (t1, t1)).sum()).backward(ctx)
 * gives 2 in the context, and backward(ctx, retain_graph) then backward(ctx) gives 4 (the seed
 * checks the doubled gradient in a fresh context); then the errors. */
TD_TEST(owner_rref_backward, .world_size = 2, .timeout_s = 60)
{
    dag_up(ctx);
    if (ctx->rank == 0) {
        td_tensor *t1 = NULL, *ones = NULL;
        TD_CHECK_OK(td_tensor_full(TD_FLOAT64, TD_SHAPE(10, 10), 0.25, &t1));
        TD_CHECK_OK(td_autograd_set_requires_grad(t1, true));
        TD_CHECK_OK(td_tensor_ones(TD_FLOAT64, TD_SHAPE(10, 10), &ones));
        td_tensor *two = NULL, *four = NULL;
        TD_CHECK_OK(td_tensor_full(TD_FLOAT64, TD_SHAPE(10, 10), 2.0, &two));
        TD_CHECK_OK(td_tensor_full(TD_FLOAT64, TD_SHAPE(10, 10), 4.0, &four));

        /* Without a context: the local engine, into .grad. */
        td_tensor *s1 = NULL, *s2 = NULL, *s = NULL;
        TD_CHECK_OK(td_autograd_sum(t1, &s1));
        TD_CHECK_OK(td_autograd_sum(t1, &s2));
        TD_CHECK_OK(td_autograd_add(s1, s2, &s));
        td_rref *r = owner_rref_of_tensor(s);
        TD_CHECK(td_rref_is_owner(r));
        TD_CHECK_OK(td_rref_backward(r, -1, false));
        td_tensor *g = local_grad(t1);
        check_close(g, two, "t1.grad after a local RRef backward");
        td_tensor_release(g);
        td_rref_release(r);
        TD_CHECK_OK(td_autograd_set_grad(t1, NULL));

        for (int passes = 1; passes <= 2; passes++) {
            int64_t id = -1;
            TD_CHECK_OK(td_dist_autograd_context_enter(NULL, &id));
            td_tensor *t2 = call_tensor(1, "dag_add", td_value_tuple_of(2, td_value_tensor(t1), td_value_tensor(t1)));
            td_tensor *sum = NULL, *gt = NULL;
            TD_CHECK_OK(td_autograd_sum(t2, &sum));
            td_rref *rr = owner_rref_of_tensor(sum);
            if (passes == 2)
                TD_CHECK_OK(td_rref_backward(rr, id, true));
            TD_CHECK_OK(td_rref_backward(rr, id, false));
            TD_CHECK_OK(td_dist_autograd_get_gradient(id, t1, &gt));
            check_close(gt, passes == 1 ? two : four, "t1 in the context after RRef backward");
            TD_CHECK(td_autograd_get_grad(t1) == NULL); /* the context, not .grad */
            td_rref_release(rr);
            TD_CHECK_OK(td_dist_autograd_context_exit(id));
            td_tensor_release(gt);
            td_tensor_release(sum);
            td_tensor_release(t2);
        }

        /* Errors: PyTorch's words. */
        td_rref *plain = owner_rref_of_tensor(ones);
        TD_CHECK_ERR(td_rref_backward(plain, -1, false), TD_ERR_INVALID,
                     "tensors does not require grad and does not have a grad_fn");
        td_rref_release(plain);
        td_rref *vec = owner_rref_of_tensor(t1);
        TD_CHECK_ERR(td_rref_backward(vec, -1, false), TD_ERR_INVALID,
                     "grad can be implicitly created only for scalar outputs");
        TD_CHECK_ERR(td_rref_backward(vec, 100, false), TD_ERR_INVALID, "Could not find autograd context with id: 100");
        td_rref_release(vec);
        td_value *foo = td_value_string("foo");
        td_rref *fr = NULL;
        TD_CHECK_OK(td_rref_create(NULL, foo, &fr));
        TD_CHECK_ERR(td_rref_backward(fr, -1, false), TD_ERR_INVALID, "RRef should contain a tensor for .backward()");
        td_rref_release(fr);
        td_value_release(foo);
        td_tensor *all[] = {t1, ones, two, four, s1, s2, s};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            td_tensor_release(all[i]);
    }
    dag_down();
}

/* test_user_rref_backward: a user RRef to remote(worker1, _sum, (t,)) made in a context;
 * backward(ctx, retain_graph) then backward(ctx) run on the owner (worker1), whose distributed
 * backward sends the gradient back: t gets 2 in the context. Then the user's errors. */
TD_TEST(user_rref_backward, .world_size = 2, .timeout_s = 60)
{
    dag_up(ctx);
    if (ctx->rank == 0) {
        td_tensor *t = NULL, *two = NULL, *gt = NULL;
        TD_CHECK_OK(td_tensor_full(TD_FLOAT64, TD_SHAPE(10), 0.75, &t));
        TD_CHECK_OK(td_autograd_set_requires_grad(t, true));
        TD_CHECK_OK(td_tensor_full(TD_FLOAT64, TD_SHAPE(10), 2.0, &two));
        int64_t id = -1;
        TD_CHECK_OK(td_dist_autograd_context_enter(NULL, &id));
        td_value *args = td_value_tuple_of(1, td_value_tensor(t));
        td_rref *r = NULL;
        TD_CHECK_OK(td_rpc_remote(NULL, td_rpc_to_id(1), "dag_sum", args, NULL, -1, &r));
        td_value_release(args);
        TD_CHECK(!td_rref_is_owner(r));
        TD_CHECK_ERR(td_rref_backward(r, -1, false), TD_ERR_INVALID,
                     "User RRefs require 'dist_autograd_ctx_id' to be specified");
        TD_CHECK_OK(td_rref_backward(r, id, true));
        TD_CHECK_OK(td_rref_backward(r, id, false));
        TD_CHECK_OK(td_dist_autograd_get_gradient(id, t, &gt));
        check_close(gt, two, "t after two backward passes through a user RRef");
        /* The owner reports the context it does not know, and a value that is not a tensor. */
        TD_CHECK_ERR(td_rref_backward(r, 100, false), TD_ERR_INVALID, "Could not find autograd context with id: 100");
        td_rref *fr = NULL;
        TD_CHECK_OK(td_rpc_remote(NULL, td_rpc_to_id(1), "dag_foo", NULL, NULL, -1, &fr));
        TD_CHECK_ERR(td_rref_backward(fr, id, false), TD_ERR_INVALID, "RRef should contain a tensor for .backward()");
        td_rref_release(fr);
        td_rref_release(r);
        TD_CHECK_OK(td_dist_autograd_context_exit(id));
        td_tensor_release(gt);
        td_tensor_release(t);
        td_tensor_release(two);
    }
    dag_down();
}

/* ---- a worker killed during the backward ---------------------------------------------------------- */

/* worker0 -> worker1 -> worker2: worker2 dies when the gradient of its param arrives, in the middle
 * of the distributed backward. The pass fails on worker0 with TD_ERR_PEER_LOST naming worker2, and
 * the context ends on the survivors. */
TD_TEST(killed_mid_backward, .world_size = 3, .timeout_s = 60, .skip_return_code_check = true,
        .allow_leftovers = true)
{
    dag_up(ctx);
    if (ctx->rank == 2)
        TD_CHECK_OK(td_autograd_register_hook(g_param, kill_hook, NULL, NULL, NULL));
    if (ctx->rank == 0) {
        td_tensor *x = leaf(1.5), *y = leaf(-2.0);
        int64_t id = -1;
        TD_CHECK_OK(td_dist_autograd_context_enter(NULL, &id));
        td_tensor *loss = chain3_forward(x, y, 2);
        TD_CHECK_ERR(td_dist_autograd_backward(id, &loss, 1, false), TD_ERR_PEER_LOST, "worker2");
        TD_CHECK_OK(td_dist_autograd_context_exit(id));
        TD_CHECK_EQ(rpc_test_debug_int("num_autograd_contexts"), 0);
        td_value *r = NULL;
        TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(1), "dag_num_contexts", NULL, NULL, -1, &r));
        TD_CHECK_EQ(td_value_get_int(r), 0);
        td_value_release(r);
        td_tensor_release(loss);
        td_tensor_release(x);
        td_tensor_release(y);
    }
    if (ctx->rank != 2) {
        /* Only the survivors meet: worker2 never returns from its backward. */
        const char *names[] = {"worker0", "worker1"};
        TD_CHECK_OK(td_rpc_barrier(NULL, names, 2, 30000));
        TD_CHECK_EQ(rpc_test_debug_int("num_autograd_contexts"), 0);
        TD_CHECK_OK(td_rpc_shutdown(true, 0));
        td_tensor_release(g_param);
        g_param = NULL;
    } else {
        /* Waits to die in the backward (the harness's timeout would catch a hang). */
        td_rpc_barrier(NULL, NULL, 0, 60000);
    }
}

/* worker2 makes a context, runs worker2 -> worker1 -> worker0 in it (so both hold a copy) and is
 * killed before it can leave the context: the survivors drop the lost worker's context on their
 * own (no context left on either), and go on working. */
TD_TEST(creator_killed_contexts_released, .world_size = 3, .timeout_s = 60, .skip_return_code_check = true,
        .allow_leftovers = true)
{
    dag_up(ctx);
    if (ctx->rank == 2) {
        td_tensor *x = leaf(1.5), *y = leaf(-2.0);
        int64_t id = -1;
        TD_CHECK_OK(td_dist_autograd_context_enter(NULL, &id));
        td_tensor *loss = chain3_forward(x, y, 0);
        td_tensor_release(loss);
        td_tensor_release(x);
        td_tensor_release(y);
        /* Stays in the context until worker1's dag_kill arrives. */
        const char *names[] = {"worker0", "worker1", "worker2"};
        td_rpc_barrier(NULL, names, 3, 60000);
        TD_CHECK_MSG(false, "worker2 outlived dag_kill");
    } else {
        rpc_test_wait_debug("num_autograd_contexts", 1, 10000); /* worker2's context reached here */
        const char *names[] = {"worker0", "worker1"};
        TD_CHECK_OK(td_rpc_barrier(NULL, names, 2, 30000));
        if (ctx->rank == 1)
            TD_CHECK(td_rpc_sync(NULL, td_rpc_to_id(2), "dag_kill", NULL, NULL, 10000, NULL) != TD_OK);
        rpc_test_wait_debug("num_autograd_contexts", 0, 10000);
        /* The survivors still work together in a context of their own. */
        if (ctx->rank == 0) {
            td_tensor *x = leaf(1.5), *y = leaf(-2.0);
            int64_t id = -1;
            TD_CHECK_OK(td_dist_autograd_context_enter(NULL, &id));
            td_tensor *loss = chain3_forward(x, y, 0);
            TD_CHECK_OK(td_dist_autograd_backward(id, &loss, 1, false));
            TD_CHECK_OK(td_dist_autograd_context_exit(id));
            td_tensor_release(loss);
            td_tensor_release(x);
            td_tensor_release(y);
        }
        TD_CHECK_OK(td_rpc_barrier(NULL, names, 2, 30000));
        TD_CHECK_EQ(rpc_test_debug_int("num_autograd_contexts"), 0);
        TD_CHECK_OK(td_rpc_shutdown(true, 0));
        td_tensor_release(g_param);
        g_param = NULL;
    }
}

TD_TEST_MAIN()
