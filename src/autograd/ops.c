/* The differentiable ops of tdist/autograd.h: each runs its tensor.h forward, then ag_record()
 * makes its node when grad mode is on and an input requires grad, saving what the backward needs
 * (data-only aliases, so saving an output makes no cycle). The backward functions below compute
 * the gradients with tensor.h's ops and kernels.c; they return gradients of the broadcast shape
 * and the computation's dtype, and the engine sums them down to each input's shape and converts
 * them to its dtype (as PyTorch's engine does in validate_outputs), so no op unbroadcasts by
 * itself. A gradient is computed only for the inputs whose edge leads somewhere (need()).
 * matmul and cross_entropy are compositions of the recorded ops (reshape + mm, log_softmax +
 * nll_loss), so their graphs are exactly PyTorch's. */
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "base/error.h"
#include "tensor/math.h"

/* Whether input i's gradient goes anywhere. */
static bool need(const td_autograd_node *n, int i) { return n->next[i].node != NULL; }

#define NODE_OPS(var, name, fn)                                                                  \
    static td_status fn(td_autograd_node *n, td_tensor *const *g, td_tensor **out);             \
    static const ag_node_ops var = {name, fn}

/* Records a one-input op's node on res and hands res out. */
static td_status finish1(const ag_node_ops *ops, td_tensor *a, td_tensor *res, td_tensor **out,
                         td_autograd_node **node)
{
    td_autograd_node *n = ag_record(ops, &a, 1, res);
    if (node)
        *node = n;
    *out = res;
    return TD_OK;
}

/* ---- elementwise binary ----------------------------------------------------------------------- */

NODE_OPS(add_ops, "AddBackward0", add_backward);
NODE_OPS(sub_ops, "SubBackward0", sub_backward);
NODE_OPS(mul_ops, "MulBackward0", mul_backward);
NODE_OPS(div_ops, "DivBackward0", div_backward);

static td_status add_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    (void)n;
    out[0] = td_tensor_retain(g[0]);
    out[1] = td_tensor_retain(g[0]);
    return TD_OK;
}

static td_status sub_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    out[0] = td_tensor_retain(g[0]);
    return need(n, 1) ? td_tensor_neg(g[0], &out[1]) : TD_OK;
}

static td_status mul_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    if (need(n, 0))
        TD_TRY(td_tensor_mul(g[0], n->saved[1], &out[0]));
    if (need(n, 1))
        TD_TRY(td_tensor_mul(g[0], n->saved[0], &out[1]));
    return TD_OK;
}

static td_status div_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    const td_tensor *a = n->saved[0], *b = n->saved[1];
    if (need(n, 0))
        TD_TRY(td_tensor_div(g[0], b, &out[0]));
    if (!need(n, 1))
        return TD_OK;
    /* d(a/b)/db = -a / b^2 */
    td_tensor *ga = NULL, *bb = NULL, *q = NULL;
    td_status st = td_tensor_mul(g[0], a, &ga);
    if (st == TD_OK)
        st = td_tensor_mul(b, b, &bb);
    if (st == TD_OK)
        st = td_tensor_div(ga, bb, &q);
    if (st == TD_OK)
        st = td_tensor_neg(q, &out[1]);
    td_tensor_release(ga);
    td_tensor_release(bb);
    td_tensor_release(q);
    return st;
}

typedef td_status (*binary_fn)(const td_tensor *, const td_tensor *, td_tensor **);

static td_status binary(const ag_node_ops *ops, binary_fn fn, bool save, td_tensor *a, td_tensor *b, td_tensor **out)
{
    td_tensor *res;
    TD_TRY(fn(a, b, &res));
    td_tensor *in[2] = {a, b};
    td_autograd_node *n = ag_record(ops, in, 2, res);
    if (n && save) {
        ag_save(n, a);
        ag_save(n, b);
    }
    *out = res;
    return TD_OK;
}

td_status td_autograd_add(td_tensor *a, td_tensor *b, td_tensor **out) { return binary(&add_ops, td_tensor_add, false, a, b, out); }
td_status td_autograd_sub(td_tensor *a, td_tensor *b, td_tensor **out) { return binary(&sub_ops, td_tensor_sub, false, a, b, out); }
td_status td_autograd_mul(td_tensor *a, td_tensor *b, td_tensor **out) { return binary(&mul_ops, td_tensor_mul, true, a, b, out); }
td_status td_autograd_div(td_tensor *a, td_tensor *b, td_tensor **out) { return binary(&div_ops, td_tensor_div, true, a, b, out); }

/* ---- with a scalar, neg ----------------------------------------------------------------------- */

NODE_OPS(add_scalar_ops, "AddBackward1", add_scalar_backward);
NODE_OPS(mul_scalar_ops, "MulBackward1", mul_scalar_backward);
NODE_OPS(neg_ops, "NegBackward0", neg_backward);

static td_status add_scalar_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    (void)n;
    out[0] = td_tensor_retain(g[0]);
    return TD_OK;
}

static td_status mul_scalar_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return td_tensor_mul_scalar(g[0], td_scalar_float(n->scalar), &out[0]);
}

static td_status neg_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    (void)n;
    return td_tensor_neg(g[0], &out[0]);
}

td_status td_autograd_add_scalar(td_tensor *a, double b, td_tensor **out)
{
    td_tensor *res;
    TD_TRY(td_tensor_add_scalar(a, td_scalar_float(b), &res));
    return finish1(&add_scalar_ops, a, res, out, NULL);
}

td_status td_autograd_mul_scalar(td_tensor *a, double b, td_tensor **out)
{
    td_tensor *res;
    td_autograd_node *n;
    TD_TRY(td_tensor_mul_scalar(a, td_scalar_float(b), &res));
    TD_TRY(finish1(&mul_scalar_ops, a, res, out, &n));
    if (n)
        n->scalar = b;
    return TD_OK;
}

td_status td_autograd_neg(td_tensor *a, td_tensor **out)
{
    td_tensor *res;
    TD_TRY(td_tensor_neg(a, &res));
    return finish1(&neg_ops, a, res, out, NULL);
}

/* ---- pow -------------------------------------------------------------------------------------- */

NODE_OPS(pow_scalar_ops, "PowBackward0", pow_scalar_backward);
NODE_OPS(pow_ops, "PowBackward1", pow_backward);

static td_status pow_scalar_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    double e = n->scalar;
    if (e == 0)
        return td_tensor_zeros(g[0]->dtype, td_tensor_shape(g[0]), &out[0]);
    td_tensor *p = NULL, *pe = NULL;
    td_status st = td_tensor_pow_scalar(n->saved[0], e - 1, &p);
    if (st == TD_OK)
        st = td_tensor_mul_scalar(p, td_scalar_float(e), &pe);
    if (st == TD_OK)
        st = td_tensor_mul(g[0], pe, &out[0]);
    td_tensor_release(p);
    td_tensor_release(pe);
    return st;
}

static td_status pow_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    const td_tensor *a = n->saved[0], *b = n->saved[1], *y = n->saved[2];
    td_status st = TD_OK;
    if (need(n, 0)) {
        /* b * a^(b - 1) */
        td_tensor *bm1 = NULL, *p = NULL, *pb = NULL;
        st = td_tensor_sub_scalar(b, td_scalar_float(1), &bm1);
        if (st == TD_OK)
            st = td_tensor_pow(a, bm1, &p);
        if (st == TD_OK)
            st = td_tensor_mul(p, b, &pb);
        if (st == TD_OK)
            st = td_tensor_mul(g[0], pb, &out[0]);
        td_tensor_release(bm1);
        td_tensor_release(p);
        td_tensor_release(pb);
    }
    if (st == TD_OK && need(n, 1))
        st = ag_pointwise_backward(AG_KERNEL_POW_EXPONENT, g[0], a, y, &out[1]);
    return st;
}

td_status td_autograd_pow_scalar(td_tensor *a, double exponent, td_tensor **out)
{
    td_tensor *res;
    td_autograd_node *n;
    TD_TRY(td_tensor_pow_scalar(a, exponent, &res));
    TD_TRY(finish1(&pow_scalar_ops, a, res, out, &n));
    if (n) {
        n->scalar = exponent;
        ag_save(n, a);
    }
    return TD_OK;
}

td_status td_autograd_pow(td_tensor *a, td_tensor *exponent, td_tensor **out)
{
    td_tensor *res;
    TD_TRY(td_tensor_pow(a, exponent, &res));
    td_tensor *in[2] = {a, exponent};
    td_autograd_node *n = ag_record(&pow_ops, in, 2, res);
    if (n) {
        ag_save(n, a);
        ag_save(n, exponent);
        ag_save(n, res);
    }
    *out = res;
    return TD_OK;
}

/* ---- unary math ------------------------------------------------------------------------------- */

NODE_OPS(exp_ops, "ExpBackward0", exp_backward);
NODE_OPS(log_ops, "LogBackward0", log_backward);
NODE_OPS(relu_ops, "ReluBackward0", relu_backward);
NODE_OPS(tanh_ops, "TanhBackward0", tanh_backward);
NODE_OPS(sigmoid_ops, "SigmoidBackward0", sigmoid_backward);

static td_status exp_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return td_tensor_mul(g[0], n->saved[0], &out[0]);
}

static td_status log_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return td_tensor_div(g[0], n->saved[0], &out[0]);
}

static td_status relu_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return ag_pointwise_backward(AG_KERNEL_RELU, g[0], n->saved[0], NULL, &out[0]);
}

static td_status tanh_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return ag_pointwise_backward(AG_KERNEL_TANH, g[0], n->saved[0], NULL, &out[0]);
}

static td_status sigmoid_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return ag_pointwise_backward(AG_KERNEL_SIGMOID, g[0], n->saved[0], NULL, &out[0]);
}

typedef td_status (*unary_fn)(const td_tensor *, td_tensor **);

/* save_output: the backward reads the result (exp, relu, tanh, sigmoid); else the input (log). */
static td_status unary(const ag_node_ops *ops, unary_fn fn, bool save_output, td_tensor *a, td_tensor **out)
{
    td_tensor *res;
    td_autograd_node *n;
    TD_TRY(fn(a, &res));
    TD_TRY(finish1(ops, a, res, out, &n));
    if (n)
        ag_save(n, save_output ? res : a);
    return TD_OK;
}

td_status td_autograd_exp(td_tensor *a, td_tensor **out) { return unary(&exp_ops, td_tensor_exp, true, a, out); }
td_status td_autograd_log(td_tensor *a, td_tensor **out) { return unary(&log_ops, td_tensor_log, false, a, out); }
td_status td_autograd_relu(td_tensor *a, td_tensor **out) { return unary(&relu_ops, td_tensor_relu, true, a, out); }
td_status td_autograd_tanh(td_tensor *a, td_tensor **out) { return unary(&tanh_ops, td_tensor_tanh, true, a, out); }
td_status td_autograd_sigmoid(td_tensor *a, td_tensor **out) { return unary(&sigmoid_ops, td_tensor_sigmoid, true, a, out); }

/* ---- matrix products -------------------------------------------------------------------------- */

NODE_OPS(mm_ops, "MmBackward0", mm_backward);
NODE_OPS(addmm_ops, "AddmmBackward0", addmm_backward);

/* g @ other^T (the first operand's gradient) or other^T @ g (the second's). */
static td_status mm_grad(const td_tensor *g, const td_tensor *other, bool first, td_tensor **out)
{
    td_tensor *t;
    TD_TRY(td_tensor_transpose((td_tensor *)other, 0, 1, &t));
    td_status st = first ? td_tensor_mm(g, t, out) : td_tensor_mm(t, g, out);
    td_tensor_release(t);
    return st;
}

/* saved: a, b; next: (first input at `at`) a, b. */
static td_status mm_grads(td_autograd_node *n, const td_tensor *g, int at, td_tensor **out)
{
    if (need(n, at))
        TD_TRY(mm_grad(g, n->saved[1], true, &out[at]));
    if (need(n, at + 1))
        TD_TRY(mm_grad(g, n->saved[0], false, &out[at + 1]));
    return TD_OK;
}

static td_status mm_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return mm_grads(n, g[0], 0, out);
}

static td_status addmm_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    if (need(n, 0))
        out[0] = td_tensor_retain(g[0]);
    return mm_grads(n, g[0], 1, out);
}

td_status td_autograd_mm(td_tensor *a, td_tensor *b, td_tensor **out)
{
    td_tensor *res;
    TD_TRY(td_tensor_mm(a, b, &res));
    td_tensor *in[2] = {a, b};
    td_autograd_node *n = ag_record(&mm_ops, in, 2, res);
    if (n) {
        ag_save(n, a);
        ag_save(n, b);
    }
    *out = res;
    return TD_OK;
}

td_status td_autograd_addmm(td_tensor *bias, td_tensor *a, td_tensor *b, td_tensor **out)
{
    td_tensor *res;
    TD_TRY(td_tensor_addmm(bias, a, b, 1, 1, &res));
    td_tensor *in[3] = {bias, a, b};
    td_autograd_node *n = ag_record(&addmm_ops, in, 3, res);
    if (n) {
        ag_save(n, a);
        ag_save(n, b);
    }
    *out = res;
    return TD_OK;
}

td_status td_autograd_matmul(td_tensor *a, td_tensor *b, td_tensor **out)
{
    if (!a || !b || !out || a->ndim < 1 || a->ndim > 2 || b->ndim < 1 || b->ndim > 2 || a->dtype != b->dtype ||
        a->sizes[a->ndim - 1] != b->sizes[0])
        return td_tensor_matmul(a, b, out); /* its checks and messages */
    if (a->ndim == 2 && b->ndim == 2)
        return td_autograd_mm(a, b, out);
    /* 1-D operands as a row (left) or a column (right) of a matrix product, reshaped back. */
    int64_t k = b->sizes[0];
    td_tensor *a2 = NULL, *b2 = NULL, *prod = NULL;
    td_status st = a->ndim == 1 ? td_autograd_reshape(a, TD_SHAPE(1, k), &a2) : (a2 = td_tensor_retain(a), TD_OK);
    if (st == TD_OK)
        st = b->ndim == 1 ? td_autograd_reshape(b, TD_SHAPE(k, 1), &b2) : (b2 = td_tensor_retain(b), TD_OK);
    if (st == TD_OK)
        st = td_autograd_mm(a2, b2, &prod);
    if (st == TD_OK) {
        td_shape shape = a->ndim == 1 && b->ndim == 1 ? TD_SHAPE_SCALAR
                         : a->ndim == 1               ? TD_SHAPE(b->sizes[1])
                                                      : TD_SHAPE(a->sizes[0]);
        st = td_autograd_reshape(prod, shape, out);
    }
    td_tensor_release(a2);
    td_tensor_release(b2);
    td_tensor_release(prod);
    return st;
}

/* ---- reductions ------------------------------------------------------------------------------- */

NODE_OPS(sum_ops, "SumBackward0", sum_backward);
NODE_OPS(sum_dim_ops, "SumBackward1", sum_dim_backward);
NODE_OPS(mean_ops, "MeanBackward0", mean_backward);
NODE_OPS(mean_dim_ops, "MeanBackward1", mean_dim_backward);

/* g (reduced over dim ints[0] unless ints[1] (keepdim), or over everything when dim is -1)
 * scaled by scale and expanded back to the input's shape. */
static td_status expand_back(td_autograd_node *n, const td_tensor *g, bool all, double scale, td_tensor **out)
{
    td_tensor *scaled = NULL, *kept = NULL;
    td_status st = scale == 1 ? (scaled = td_tensor_retain((td_tensor *)g), TD_OK)
                              : td_tensor_mul_scalar(g, td_scalar_float(scale), &scaled);
    if (st == TD_OK)
        st = all || n->ints[1] ? (kept = td_tensor_retain(scaled), TD_OK)
                               : td_tensor_unsqueeze(scaled, (int)n->ints[0], &kept);
    if (st == TD_OK)
        st = td_tensor_expand(kept, n->shape, out);
    td_tensor_release(scaled);
    td_tensor_release(kept);
    return st;
}

static td_status sum_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return expand_back(n, g[0], true, 1, out);
}

static td_status sum_dim_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return expand_back(n, g[0], false, 1, out);
}

static td_status mean_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return expand_back(n, g[0], true, 1.0 / (double)td_shape_numel(&n->shape), out);
}

static td_status mean_dim_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return expand_back(n, g[0], false, 1.0 / (double)(n->shape.ndim ? n->shape.d[n->ints[0]] : 1), out);
}

static td_status reduced(const ag_node_ops *ops, td_tensor *a, td_tensor *res, int dim, bool keepdim,
                         td_tensor **out)
{
    td_autograd_node *n;
    TD_TRY(finish1(ops, a, res, out, &n));
    if (n) {
        int wrapped = 0;
        if (dim >= 0 || a->ndim)
            tensor_wrap_dim(dim, a->ndim, &wrapped);
        n->ints[0] = wrapped;
        n->ints[1] = keepdim || a->ndim == 0;
        n->shape = td_tensor_shape(a);
    }
    return TD_OK;
}

td_status td_autograd_sum(td_tensor *a, td_tensor **out)
{
    td_tensor *res;
    TD_TRY(td_tensor_sum(a, &res));
    return reduced(&sum_ops, a, res, 0, false, out);
}

td_status td_autograd_sum_dim(td_tensor *a, int dim, bool keepdim, td_tensor **out)
{
    td_tensor *res;
    TD_TRY(td_tensor_sum_dim(a, dim, keepdim, &res));
    return reduced(&sum_dim_ops, a, res, dim, keepdim, out);
}

td_status td_autograd_mean(td_tensor *a, td_tensor **out)
{
    td_tensor *res;
    TD_TRY(td_tensor_mean(a, &res));
    return reduced(&mean_ops, a, res, 0, false, out);
}

td_status td_autograd_mean_dim(td_tensor *a, int dim, bool keepdim, td_tensor **out)
{
    td_tensor *res;
    TD_TRY(td_tensor_mean_dim(a, dim, keepdim, &res));
    return reduced(&mean_dim_ops, a, res, dim, keepdim, out);
}

/* ---- softmax and losses ----------------------------------------------------------------------- */

NODE_OPS(softmax_ops, "SoftmaxBackward0", softmax_backward);
NODE_OPS(log_softmax_ops, "LogSoftmaxBackward0", log_softmax_backward);
NODE_OPS(nll_ops, "NllLossBackward0", nll_backward);

static td_status softmax_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return ag_softmax_backward(g[0], n->saved[0], (int)n->ints[0], false, &out[0]);
}

static td_status log_softmax_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return ag_softmax_backward(g[0], n->saved[0], (int)n->ints[0], true, &out[0]);
}

static td_status nll_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return ag_nll_loss_backward(g[0], n->saved[0], n->saved[1], (td_loss_reduction)n->ints[0], n->ints[1], &out[0]);
}

static td_status softmax_op(const ag_node_ops *ops, td_status (*fn)(const td_tensor *, int, td_tensor **),
                            td_tensor *a, int dim, td_tensor **out)
{
    td_tensor *res;
    td_autograd_node *n;
    TD_TRY(fn(a, dim, &res));
    TD_TRY(finish1(ops, a, res, out, &n));
    if (n) {
        ag_save(n, res);
        n->ints[0] = dim;
    }
    return TD_OK;
}

td_status td_autograd_softmax(td_tensor *a, int dim, td_tensor **out)
{
    return softmax_op(&softmax_ops, td_tensor_softmax, a, dim, out);
}

td_status td_autograd_log_softmax(td_tensor *a, int dim, td_tensor **out)
{
    return softmax_op(&log_softmax_ops, td_tensor_log_softmax, a, dim, out);
}

td_status td_autograd_nll_loss(td_tensor *input, td_tensor *target, td_loss_reduction reduction, int64_t ignore_index,
                               td_tensor **out)
{
    td_tensor *res;
    td_autograd_node *n;
    TD_TRY(td_tensor_nll_loss(input, target, reduction, ignore_index, &res));
    TD_TRY(finish1(&nll_ops, input, res, out, &n));
    if (n) {
        ag_save(n, input);
        ag_save(n, target);
        n->ints[0] = reduction;
        n->ints[1] = ignore_index;
    }
    return TD_OK;
}

td_status td_autograd_cross_entropy(td_tensor *input, td_tensor *target, td_loss_reduction reduction,
                                    int64_t ignore_index, td_tensor **out)
{
    if (!input || !out)
        return td_tensor_nll_loss(input, target, reduction, ignore_index, out); /* its message */
    td_tensor *logp;
    TD_TRY(td_autograd_log_softmax(input, input->ndim == 1 ? 0 : 1, &logp));
    td_status st = td_autograd_nll_loss(logp, target, reduction, ignore_index, out);
    td_tensor_release(logp);
    return st;
}

/* ---- shape ops -------------------------------------------------------------------------------- */

NODE_OPS(view_ops, "ViewBackward0", view_backward);
NODE_OPS(transpose_ops, "TransposeBackward0", transpose_backward);
NODE_OPS(narrow_ops, "SliceBackward0", narrow_backward);
NODE_OPS(cat_ops, "CatBackward0", cat_backward);
NODE_OPS(bag_ops, "EmbeddingBagBackward0", bag_backward);

static td_status view_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return td_tensor_reshape(g[0], n->shape, &out[0]);
}

static td_status transpose_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return td_tensor_transpose(g[0], (int)n->ints[0], (int)n->ints[1], &out[0]);
}

static td_status narrow_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    td_tensor *full, *part;
    TD_TRY(td_tensor_zeros(g[0]->dtype, n->shape, &full));
    td_status st = td_tensor_narrow(full, (int)n->ints[0], n->ints[1], n->ints[2], &part);
    if (st == TD_OK) {
        st = td_tensor_copy(part, g[0]);
        td_tensor_release(part);
    }
    if (st != TD_OK) {
        td_tensor_release(full);
        return st;
    }
    out[0] = full;
    return TD_OK;
}

static td_status cat_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    int dim = (int)n->ints[0];
    int64_t at = 0;
    for (int i = 0; i < n->num_next; i++) {
        const td_shape *s = &n->input_meta[i].shape;
        if (s->ndim == 1 && s->d[0] == 0 && g[0]->ndim != 1)
            continue; /* skipped by cat */
        int64_t len = s->d[dim];
        if (need(n, i))
            TD_TRY(td_tensor_narrow(g[0], dim, at, len, &out[i]));
        at += len;
    }
    return TD_OK;
}

static td_status bag_backward(td_autograd_node *n, td_tensor *const *g, td_tensor **out)
{
    return ag_embedding_bag_backward(g[0], n->saved[0], n->saved[1], n->saved[2], (td_embedding_bag_mode)n->ints[0],
                                     &out[0]);
}

static td_status viewed(td_tensor *a, td_tensor *res, td_tensor **out)
{
    td_autograd_node *n;
    TD_TRY(finish1(&view_ops, a, res, out, &n));
    if (n)
        n->shape = td_tensor_shape(a);
    return TD_OK;
}

td_status td_autograd_reshape(td_tensor *a, td_shape shape, td_tensor **out)
{
    td_tensor *res;
    TD_TRY(td_tensor_reshape(a, shape, &res));
    return viewed(a, res, out);
}

td_status td_autograd_view(td_tensor *a, td_shape shape, td_tensor **out)
{
    td_tensor *res;
    TD_TRY(td_tensor_view(a, shape, &res));
    return viewed(a, res, out);
}

td_status td_autograd_transpose(td_tensor *a, int dim0, int dim1, td_tensor **out)
{
    td_tensor *res;
    td_autograd_node *n;
    TD_TRY(td_tensor_transpose(a, dim0, dim1, &res));
    TD_TRY(finish1(&transpose_ops, a, res, out, &n));
    if (n) {
        n->ints[0] = dim0;
        n->ints[1] = dim1;
    }
    return TD_OK;
}

td_status td_autograd_narrow(td_tensor *a, int dim, int64_t start, int64_t length, td_tensor **out)
{
    td_tensor *res;
    td_autograd_node *n;
    TD_TRY(td_tensor_narrow(a, dim, start, length, &res));
    TD_TRY(finish1(&narrow_ops, a, res, out, &n));
    if (n) {
        int d = 0;
        tensor_wrap_dim(dim, a->ndim, &d);
        n->ints[0] = d;
        n->ints[1] = start < 0 ? start + a->sizes[d] : start;
        n->ints[2] = length;
        n->shape = td_tensor_shape(a);
    }
    return TD_OK;
}

td_status td_autograd_cat(td_tensor *const *tensors, int n, int dim, td_tensor **out)
{
    td_tensor *res;
    TD_TRY(td_tensor_cat((const td_tensor *const *)tensors, n, dim, &res));
    td_autograd_node *node = ag_record(&cat_ops, tensors, n, res);
    if (node) {
        int d = 0;
        tensor_wrap_dim(dim, res->ndim, &d);
        node->ints[0] = d;
    }
    *out = res;
    return TD_OK;
}

td_status td_autograd_embedding_bag(td_tensor *weight, td_tensor *indices, td_tensor *offsets,
                                    td_embedding_bag_mode mode, td_tensor **out)
{
    td_tensor *res;
    td_autograd_node *n;
    TD_TRY(td_tensor_embedding_bag(weight, indices, offsets, mode, &res));
    TD_TRY(finish1(&bag_ops, weight, res, out, &n));
    if (n) {
        ag_save(n, weight);
        ag_save(n, indices);
        if (offsets)
            ag_save(n, offsets);
        else
            n->num_saved++; /* saved[2] stays NULL: 2-D indices */
        n->ints[0] = mode;
    }
    return TD_OK;
}
