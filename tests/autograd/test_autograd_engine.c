/* The autograd engine and the tensor side of tdist/autograd.h: PyTorch's error messages,
 * retain_graph and .grad accumulation, the second-backward error, grad mode, leaves and
 * non-leaves, retain_grad, tensor hooks and post-accumulate hooks (and their order), autograd.grad,
 * functions with a custom backward, a deep chain, and concurrent backward passes from 4 threads
 * (separate graphs, and graphs sharing one leaf). */
#include <pthread.h>
#include <string.h>

#include "ag_util.h"

static td_tensor *scalar64(double v)
{
    td_tensor *t;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT64, TD_SHAPE_SCALAR, v, &t));
    return t;
}

static double grad_at(td_tensor *t, int64_t k)
{
    td_tensor *g = td_autograd_get_grad(t);
    TD_CHECK_MSG(g, "no .grad");
    double v = ag_at(g, k);
    td_tensor_release(g);
    return v;
}

TD_TEST(backward_errors_are_pytorchs)
{
    (void)ctx;
    td_tensor *plain = scalar64(2), *v;
    TD_CHECK_ERR(td_autograd_backward(plain, NULL, false), TD_ERR_INVALID,
                 "element 0 of tensors does not require grad and does not have a grad_fn");
    TD_CHECK_STR_EQ(td_last_error(), "element 0 of tensors does not require grad and does not have a grad_fn");
    uint64_t s = 1;
    td_tensor *x = ag_randn(TD_SHAPE(3), -1, 1, 0, true, &s);
    TD_CHECK_OK(td_autograd_mul_scalar(x, 2, &v));
    TD_CHECK_ERR(td_autograd_backward(v, NULL, false), TD_ERR_INVALID, NULL);
    TD_CHECK_STR_EQ(td_last_error(), "grad can be implicitly created only for scalar outputs");
    td_tensor *bad_grad = ag_randn(TD_SHAPE(2), -1, 1, 0, false, &s);
    TD_CHECK_ERR(td_autograd_backward(v, bad_grad, false), TD_ERR_INVALID,
                 "Mismatch in shape: grad_output[0] has a shape of torch.Size([2]) and output[0] has a shape of "
                 "torch.Size([3]).");
    td_tensor *vsum;
    TD_CHECK_OK(td_autograd_sum(v, &vsum));
    td_tensor *roots[2] = {vsum, plain};
    TD_CHECK_ERR(td_autograd_backward_many(roots, NULL, 2, false), TD_ERR_INVALID,
                 "element 1 of tensors does not require grad and does not have a grad_fn");
    td_tensor_release(vsum);
    /* requires_grad rules */
    td_tensor *ints;
    TD_CHECK_OK(td_tensor_zeros(TD_INT64, TD_SHAPE(2), &ints));
    TD_CHECK_ERR(td_autograd_set_requires_grad(ints, true), TD_ERR_INVALID,
                 "only Tensors of floating point and complex dtype can require gradients");
    TD_CHECK_ERR(td_autograd_set_requires_grad(v, false), TD_ERR_INVALID,
                 "you can only change requires_grad flags of leaf variables.");
    TD_CHECK_ERR(td_autograd_register_hook(plain, NULL, NULL, NULL, NULL), TD_ERR_INVALID, NULL);
    td_tensor_release(ints);
    td_tensor_release(bad_grad);
    td_tensor_release(plain);
    td_tensor_release(x);
    td_tensor_release(v);
}

TD_TEST(second_backward_fails_without_retain_graph)
{
    (void)ctx;
    uint64_t s = 2;
    td_tensor *x = ag_randn(TD_SHAPE(3), -1, 1, 0, true, &s), *e, *loss;
    TD_CHECK_OK(td_autograd_exp(x, &e)); /* saves its output */
    TD_CHECK_OK(td_autograd_sum(e, &loss));
    TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
    TD_CHECK_ERR(td_autograd_backward(loss, NULL, false), TD_ERR_INVALID, NULL);
    TD_CHECK_CONTAINS(td_last_error(),
                      "Trying to backward through the graph a second time (or directly access saved tensors after "
                      "they have already been freed). Saved intermediate values of the graph are freed when you call "
                      ".backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the "
                      "graph a second time or if you need to access saved tensors after calling backward.");
    td_tensor_release(loss);
    td_tensor_release(e);
    /* A graph that saved nothing can run twice, as in PyTorch. */
    td_tensor *y, *z;
    TD_CHECK_OK(td_autograd_add_scalar(x, 1, &y));
    TD_CHECK_OK(td_autograd_sum(y, &z));
    TD_CHECK_OK(td_autograd_set_grad(x, NULL));
    TD_CHECK_OK(td_autograd_backward(z, NULL, false));
    TD_CHECK_OK(td_autograd_backward(z, NULL, false));
    TD_CHECK_NEAR(grad_at(x, 0), 2, 0);
    td_tensor_release(y);
    td_tensor_release(z);
    td_tensor_release(x);
}

TD_TEST(retain_graph_accumulates_twice)
{
    (void)ctx;
    uint64_t s = 3;
    td_tensor *x = ag_randn(TD_SHAPE(2, 3), -1, 1, 0, true, &s), *w = ag_randn(TD_SHAPE(3, 2), -1, 1, 0, true, &s);
    td_tensor *y, *t, *loss;
    TD_CHECK_OK(td_autograd_mm(x, w, &y));
    TD_CHECK_OK(td_autograd_tanh(y, &t));
    TD_CHECK_OK(td_autograd_sum(t, &loss));
    TD_CHECK_OK(td_autograd_backward(loss, NULL, true));
    td_tensor *once = td_autograd_get_grad(w), *once_copy;
    TD_CHECK_OK(td_tensor_clone(once, &once_copy));
    TD_CHECK_OK(td_autograd_backward(loss, NULL, true));
    td_tensor *twice = td_autograd_get_grad(w);
    TD_CHECK(twice == once); /* accumulated in place */
    for (int64_t k = 0; k < 6; k++)
        TD_CHECK_NEAR(ag_at(twice, k), 2 * ag_at(once_copy, k), 1e-15);
    TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
    for (int64_t k = 0; k < 6; k++)
        TD_CHECK_NEAR(ag_at(twice, k), 3 * ag_at(once_copy, k), 1e-15);
    TD_CHECK_ERR(td_autograd_backward(loss, NULL, false), TD_ERR_INVALID, "Trying to backward through the graph");
    /* A given gradient scales the result. */
    td_tensor *y2, *l2, *g = scalar64(0.5);
    TD_CHECK_OK(td_autograd_set_grad(x, NULL));
    TD_CHECK_OK(td_autograd_sum(x, &y2));
    TD_CHECK_OK(td_autograd_mul_scalar(y2, 4, &l2));
    TD_CHECK_OK(td_autograd_backward(l2, g, false));
    TD_CHECK_NEAR(grad_at(x, 0), 2, 0);
    td_tensor_release(y2);
    td_tensor_release(l2);
    td_tensor_release(g);
    td_tensor_release(once);
    td_tensor_release(twice);
    td_tensor_release(once_copy);
    td_tensor_release(y);
    td_tensor_release(t);
    td_tensor_release(loss);
    td_tensor_release(x);
    td_tensor_release(w);
}

TD_TEST(no_grad_scope)
{
    (void)ctx;
    uint64_t s = 4;
    td_tensor *x = ag_randn(TD_SHAPE(3), -1, 1, 0, true, &s), *y = NULL, *z;
    TD_CHECK(td_autograd_is_grad_enabled());
    TD_NO_GRAD
    {
        TD_CHECK(!td_autograd_is_grad_enabled());
        TD_CHECK_OK(td_autograd_mul(x, x, &y));
    }
    TD_CHECK(td_autograd_is_grad_enabled());
    TD_CHECK(!td_autograd_requires_grad(y));
    TD_CHECK(td_autograd_grad_fn(y) == NULL);
    TD_CHECK(td_autograd_is_leaf(y));
    TD_CHECK_ERR(td_autograd_backward(y, NULL, false), TD_ERR_INVALID, "element 0 of tensors does not require grad");
    TD_CHECK(td_autograd_set_grad_enabled(false));
    TD_CHECK(!td_autograd_set_grad_enabled(true));
    TD_CHECK_OK(td_autograd_mul(x, x, &z));
    TD_CHECK(td_autograd_requires_grad(z));
    td_tensor_release(y);
    td_tensor_release(z);
    td_tensor_release(x);
}

TD_TEST(leaf_and_non_leaf)
{
    (void)ctx;
    uint64_t s = 5;
    td_tensor *x = ag_randn(TD_SHAPE(3), -1, 1, 0, true, &s), *c = ag_randn(TD_SHAPE(3), -1, 1, 0, false, &s);
    td_tensor *y, *z, *loss, *d;
    TD_CHECK(td_autograd_is_leaf(x) && td_autograd_requires_grad(x) && !td_autograd_grad_fn(x));
    TD_CHECK(td_autograd_is_leaf(c) && !td_autograd_requires_grad(c));
    TD_CHECK_OK(td_autograd_mul(x, c, &y));
    TD_CHECK(!td_autograd_is_leaf(y) && td_autograd_requires_grad(y));
    TD_CHECK_STR_EQ(td_autograd_node_name(td_autograd_grad_fn(y)), "MulBackward0");
    td_autograd_node *acc = td_autograd_node_next(td_autograd_grad_fn(y), 0);
    TD_CHECK_STR_EQ(td_autograd_node_name(acc), "AccumulateGrad");
    TD_CHECK(td_autograd_node_next(td_autograd_grad_fn(y), 1) == NULL); /* c needs no gradient */
    TD_CHECK_OK(td_autograd_retain_grad(y));
    TD_CHECK_OK(td_autograd_mul_scalar(y, 3, &z));
    TD_CHECK_OK(td_autograd_sum(z, &loss));
    TD_CHECK_STR_EQ(td_autograd_node_name(td_autograd_grad_fn(loss)), "SumBackward0");
    TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
    TD_CHECK(td_autograd_get_grad(z) == NULL); /* a non-leaf without retain_grad */
    TD_CHECK(td_autograd_get_grad(c) == NULL);
    for (int64_t k = 0; k < 3; k++) {
        TD_CHECK_NEAR(grad_at(y, k), 3, 0);
        TD_CHECK_NEAR(grad_at(x, k), 3 * ag_at(c, k), 1e-15);
    }
    TD_CHECK_OK(td_autograd_detach(y, &d));
    TD_CHECK(td_autograd_is_leaf(d) && !td_autograd_requires_grad(d));
    TD_CHECK(td_tensor_data(d) == td_tensor_data(y));
    td_tensor_release(d);
    td_tensor_release(y);
    td_tensor_release(z);
    td_tensor_release(loss);
    td_tensor_release(x);
    td_tensor_release(c);
}

/* ---- hooks ------------------------------------------------------------------------------------ */

static td_status double_hook(td_tensor *grad, void *ctx, td_tensor **replace)
{
    int *calls = ctx;
    (*calls)++;
    return td_tensor_mul_scalar(grad, td_scalar_float(2), replace);
}

static td_status observe_hook(td_tensor *grad, void *ctx, td_tensor **replace)
{
    (void)replace;
    double *seen = ctx;
    *seen = ag_at(grad, 0);
    return TD_OK;
}

static td_status failing_hook(td_tensor *grad, void *ctx, td_tensor **replace)
{
    (void)ctx;
    (void)replace;
    td_tensor *never;
    return td_tensor_view(grad, TD_SHAPE(7, 7), &never); /* fails with the view's message */
}

TD_TEST(tensor_hooks_modify_the_gradient)
{
    (void)ctx;
    uint64_t s = 6;
    td_tensor *x = ag_randn(TD_SHAPE(3), -1, 1, 0, true, &s), *y, *z, *loss;
    int leaf_calls = 0, mid_calls = 0;
    double seen = 0;
    TD_CHECK_OK(td_autograd_mul_scalar(x, 5, &y));
    TD_CHECK_OK(td_autograd_exp(y, &z));
    TD_CHECK_OK(td_autograd_sum(z, &loss));
    uint64_t h_mid, h_obs;
    TD_CHECK_OK(td_autograd_register_hook(y, double_hook, &mid_calls, NULL, &h_mid));
    TD_CHECK_OK(td_autograd_register_hook(y, observe_hook, &seen, NULL, &h_obs)); /* sees the doubled one */
    TD_CHECK_OK(td_autograd_register_hook(x, double_hook, &leaf_calls, NULL, NULL));
    TD_CHECK_OK(td_autograd_backward(loss, NULL, true));
    TD_CHECK_EQ(mid_calls, 1);
    TD_CHECK_EQ(leaf_calls, 1);
    TD_CHECK_NEAR(seen, 2 * exp(5 * ag_at(x, 0)), 1e-9);
    for (int64_t k = 0; k < 3; k++)
        TD_CHECK_NEAR(grad_at(x, k), 4 * 5 * exp(5 * ag_at(x, k)), 1e-9);
    /* Removed, the hook no longer runs. */
    TD_CHECK_OK(td_autograd_remove_hook(y, h_mid));
    TD_CHECK_ERR(td_autograd_remove_hook(y, h_mid), TD_ERR_INVALID, "no hook with handle");
    TD_CHECK_OK(td_autograd_set_grad(x, NULL));
    TD_CHECK_OK(td_autograd_backward(loss, NULL, true));
    TD_CHECK_EQ(mid_calls, 1);
    TD_CHECK_NEAR(grad_at(x, 0), 2 * 5 * exp(5 * ag_at(x, 0)), 1e-9);
    /* A failing hook fails the pass with its status. */
    TD_CHECK_OK(td_autograd_register_hook(y, failing_hook, NULL, NULL, NULL));
    TD_CHECK_ERR(td_autograd_backward(loss, NULL, true), TD_ERR_INVALID, NULL);
    td_tensor_release(x);
    td_tensor_release(y);
    td_tensor_release(z);
    td_tensor_release(loss);
}

typedef struct order_log {
    const td_tensor *leaves[4];
    int order[8];
    int n;
    double grad0[8];
} order_log;

static td_status post_hook(td_tensor *leaf, void *ctx)
{
    order_log *log = ctx;
    int which = -1;
    for (int i = 0; i < 4; i++)
        which = log->leaves[i] == leaf ? i : which;
    td_tensor *g = td_autograd_get_grad(leaf); /* already accumulated */
    log->grad0[log->n] = ag_at(g, 0);
    td_tensor_release(g);
    log->order[log->n++] = which;
    return TD_OK;
}

static int freed_contexts;
static void count_free(void *ctx)
{
    (void)ctx;
    freed_contexts++;
}

TD_TEST(post_accumulate_hooks_run_after_accumulation_in_graph_order)
{
    (void)ctx;
    uint64_t s = 7;
    /* loss = sum(relu(relu(x @ w1) @ w2) @ w3): the leaves become ready w3, w2, w1. */
    td_tensor *x = ag_randn(TD_SHAPE(2, 3), -1, 1, 0, false, &s);
    td_tensor *w1 = ag_randn(TD_SHAPE(3, 3), -1, 1, 0, true, &s), *w2 = ag_randn(TD_SHAPE(3, 3), -1, 1, 0, true, &s),
              *w3 = ag_randn(TD_SHAPE(3, 1), -1, 1, 0, true, &s);
    order_log log = {.leaves = {w1, w2, w3}};
    freed_contexts = 0;
    TD_CHECK_OK(td_autograd_register_post_accumulate_hook(w1, post_hook, &log, count_free, NULL));
    TD_CHECK_OK(td_autograd_register_post_accumulate_hook(w2, post_hook, &log, count_free, NULL));
    TD_CHECK_OK(td_autograd_register_post_accumulate_hook(w3, post_hook, &log, count_free, NULL));
    td_tensor *h1, *a1, *h2, *a2, *h3, *loss;
    TD_CHECK_OK(td_autograd_mm(x, w1, &h1));
    TD_CHECK_OK(td_autograd_relu(h1, &a1));
    TD_CHECK_OK(td_autograd_mm(a1, w2, &h2));
    TD_CHECK_OK(td_autograd_relu(h2, &a2));
    TD_CHECK_OK(td_autograd_mm(a2, w3, &h3));
    TD_CHECK_OK(td_autograd_sum(h3, &loss));
    TD_CHECK_ERR(td_autograd_register_post_accumulate_hook(h1, post_hook, &log, NULL, NULL), TD_ERR_INVALID,
                 "post accumulate grad hooks cannot be registered on non-leaf tensors");
    TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
    TD_CHECK_EQ(log.n, 3);
    TD_CHECK_EQ(log.order[0], 2);
    TD_CHECK_EQ(log.order[1], 1);
    TD_CHECK_EQ(log.order[2], 0);
    TD_CHECK_NEAR(log.grad0[0], grad_at(w3, 0), 0);
    TD_CHECK_NEAR(log.grad0[2], grad_at(w1, 0), 0);
    td_tensor *all[] = {h1, a1, h2, a2, h3, loss, x, w1, w2, w3};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_tensor_release(all[i]);
    TD_CHECK_EQ(freed_contexts, 3); /* with the leaves' AccumulateGrad nodes */
}

TD_TEST(autograd_grad_leaves_dot_grad_alone)
{
    (void)ctx;
    uint64_t s = 8;
    td_tensor *x = ag_randn(TD_SHAPE(3), 0.5, 1, 0, true, &s), *u = ag_randn(TD_SHAPE(3), 0.5, 1, 0, true, &s);
    td_tensor *y, *loss, *grads[2] = {NULL, NULL};
    TD_CHECK_OK(td_autograd_pow_scalar(x, 3, &y));
    TD_CHECK_OK(td_autograd_sum(y, &loss));
    TD_CHECK_ERR(td_autograd_grad(&loss, NULL, 1, (td_tensor *[]){x, u}, 2, true, false, grads), TD_ERR_INVALID,
                 "One of the differentiated Tensors appears to not have been used in the graph. Set "
                 "allow_unused=True if this is the desired behavior.");
    TD_CHECK_OK(td_autograd_grad(&loss, NULL, 1, (td_tensor *[]){x, u}, 2, false, true, grads));
    TD_CHECK(grads[1] == NULL);
    for (int64_t k = 0; k < 3; k++)
        TD_CHECK_NEAR(ag_at(grads[0], k), 3 * ag_at(x, k) * ag_at(x, k), 1e-12);
    TD_CHECK(td_autograd_get_grad(x) == NULL);
    td_tensor_release(grads[0]);
    td_tensor_release(y);
    td_tensor_release(loss);
    td_tensor_release(x);
    td_tensor_release(u);
}

/* ---- custom functions ------------------------------------------------------------------------- */

typedef struct square_ctx {
    td_tensor *saved_x;
    int *destroyed;
} square_ctx;

static td_status square_backward(void *vctx, td_tensor *const *grad_outputs, int num_outputs, td_tensor **grad_inputs,
                                 int num_inputs)
{
    square_ctx *c = vctx;
    TD_CHECK_EQ(num_outputs, 1);
    TD_CHECK_EQ(num_inputs, 1);
    td_tensor *two_x;
    AG_TRY(td_tensor_mul_scalar(c->saved_x, td_scalar_float(2), &two_x));
    td_status st = td_tensor_mul(grad_outputs[0], two_x, &grad_inputs[0]);
    td_tensor_release(two_x);
    return st;
}

static void square_release(void *vctx)
{
    square_ctx *c = vctx;
    td_tensor_release(c->saved_x);
    c->saved_x = NULL;
}

static void square_destroy(void *vctx)
{
    square_ctx *c = vctx;
    (*c->destroyed)++;
    free(c);
}

static const td_autograd_function square_fn = {"SquareBackward", square_backward, square_release, square_destroy};

static td_status square(td_tensor *x, int *destroyed, td_tensor **out)
{
    AG_TRY(td_tensor_mul(x, x, out));
    square_ctx *c = malloc(sizeof *c);
    td_tensor *detached;
    AG_TRY(td_autograd_detach(x, &detached));
    *c = (square_ctx){detached, destroyed};
    return td_autograd_function_record(&square_fn, c, &x, 1, out, 1, NULL);
}

TD_TEST(custom_function_backward)
{
    (void)ctx;
    uint64_t s = 9;
    int destroyed = 0;
    td_tensor *x = ag_randn(TD_SHAPE(4), -1, 1, 0, true, &s), *y, *loss;
    TD_CHECK_OK(square(x, &destroyed, &y));
    TD_CHECK_STR_EQ(td_autograd_node_name(td_autograd_grad_fn(y)), "SquareBackward");
    TD_CHECK_OK(td_autograd_sum(y, &loss));
    TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
    for (int64_t k = 0; k < 4; k++)
        TD_CHECK_NEAR(grad_at(x, k), 2 * ag_at(x, k), 1e-15);
    TD_CHECK_ERR(td_autograd_backward(loss, NULL, false), TD_ERR_INVALID, "Trying to backward through the graph");
    td_tensor_release(loss);
    td_tensor_release(y);
    TD_CHECK_EQ(destroyed, 1);
    /* Without an input that requires grad nothing is recorded, and ctx is destroyed at once. */
    td_tensor *c = ag_randn(TD_SHAPE(4), -1, 1, 0, false, &s);
    TD_CHECK_OK(square(c, &destroyed, &y));
    TD_CHECK_EQ(destroyed, 2);
    TD_CHECK(!td_autograd_requires_grad(y));
    td_tensor_release(y);
    td_tensor_release(c);
    td_tensor_release(x);
}

TD_TEST(a_deep_chain_runs_and_frees_without_recursion)
{
    (void)ctx;
    td_tensor *x = scalar64(0), *cur = td_tensor_retain(x), *next;
    TD_CHECK_OK(td_autograd_set_requires_grad(x, true));
    for (int i = 0; i < 100000; i++) {
        TD_CHECK_OK(td_autograd_add_scalar(cur, 1, &next));
        td_tensor_release(cur);
        cur = next;
    }
    TD_CHECK_OK(td_autograd_mul_scalar(cur, 2, &next));
    td_tensor_release(cur);
    TD_CHECK_OK(td_autograd_backward(next, NULL, false));
    TD_CHECK_NEAR(grad_at(x, 0), 2, 0);
    td_tensor_release(next); /* frees 100001 nodes */
    td_tensor_release(x);
}

/* ---- threads ---------------------------------------------------------------------------------- */

typedef struct worker_arg {
    td_tensor *shared_w; /* a leaf every thread's graph uses */
    double own_grad0;
    int failures;
} worker_arg;

/* loss = sum(tanh(x @ w) * softmax(x @ v)) on a thread's own x, v and the shared w. */
static td_status small_net(td_tensor *x, td_tensor *w, td_tensor *v, td_tensor **loss)
{
    td_tensor *a, *b, *t, *sm, *p;
    AG_TRY(td_autograd_mm(x, w, &a));
    AG_TRY(td_autograd_mm(x, v, &b));
    AG_TRY(td_autograd_tanh(a, &t));
    AG_TRY(td_autograd_softmax(b, 1, &sm));
    AG_TRY(td_autograd_mul(t, sm, &p));
    td_status st = td_autograd_sum(p, loss);
    td_tensor *all[] = {a, b, t, sm, p};
    for (int i = 0; i < 5; i++)
        td_tensor_release(all[i]);
    return st;
}

enum { PASSES = 40 };

static void *worker(void *varg)
{
    worker_arg *arg = varg;
    uint64_t s = 77; /* the same data on every thread */
    td_tensor *x = ag_randn(TD_SHAPE(8, 6), -1, 1, 0, false, &s), *v = ag_randn(TD_SHAPE(6, 5), -1, 1, 0, true, &s);
    for (int i = 0; i < PASSES; i++) {
        td_tensor *loss;
        if (small_net(x, arg->shared_w, v, &loss) != TD_OK || td_autograd_backward(loss, NULL, false) != TD_OK)
            arg->failures++;
        td_tensor_release(loss);
    }
    td_tensor *g = td_autograd_get_grad(v);
    double *gv = td_tensor_data(g);
    arg->own_grad0 = gv[0];
    td_tensor_release(g);
    td_tensor_release(x);
    td_tensor_release(v);
    return NULL;
}

TD_TEST(concurrent_backward_from_four_threads)
{
    (void)ctx;
    uint64_t s = 1234;
    td_tensor *w = ag_randn(TD_SHAPE(6, 5), -1, 1, 0, true, &s);
    /* The reference: one thread, one pass. */
    worker_arg ref = {w, 0, 0};
    {
        uint64_t s2 = 77;
        td_tensor *x = ag_randn(TD_SHAPE(8, 6), -1, 1, 0, false, &s2), *v = ag_randn(TD_SHAPE(6, 5), -1, 1, 0, true, &s2);
        td_tensor *loss;
        TD_CHECK_OK(small_net(x, w, v, &loss));
        TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
        td_tensor *g = td_autograd_get_grad(v);
        ref.own_grad0 = ag_at(g, 0);
        td_tensor_release(g);
        td_tensor_release(loss);
        td_tensor_release(x);
        td_tensor_release(v);
    }
    td_tensor *w_once = td_autograd_get_grad(w), *w_ref;
    TD_CHECK_OK(td_tensor_clone(w_once, &w_ref));
    td_tensor_release(w_once);
    TD_CHECK_OK(td_autograd_set_grad(w, NULL));
    pthread_t th[4];
    worker_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (worker_arg){w, 0, 0};
        TD_CHECK_EQ(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        TD_CHECK_EQ(args[i].failures, 0);
        TD_CHECK_NEAR(args[i].own_grad0, PASSES * ref.own_grad0, 1e-9 * PASSES);
    }
    /* The shared leaf got every pass of every thread. */
    td_tensor *g = td_autograd_get_grad(w);
    for (int64_t k = 0; k < td_tensor_numel(w); k++)
        TD_CHECK_NEAR(ag_at(g, k), 4 * PASSES * ag_at(w_ref, k), 1e-9 * 4 * PASSES);
    td_tensor_release(g);
    td_tensor_release(w_ref);
    td_tensor_release(w);
}

TD_TEST_MAIN()
