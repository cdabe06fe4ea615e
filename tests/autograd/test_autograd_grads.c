/* The gradient of every differentiable op of tdist/autograd.h against central finite differences
 * in float64, over several shapes and broadcasting cases (ag_util.h's ag_gradcheck), then the
 * same graphs in float32, float16 and bfloat16 against the float64 gradients, and mixed dtypes
 * (each input's gradient comes back in its own dtype). */
#include <string.h>

#include "ag_util.h"

/* ---- the functions under test ----------------------------------------------------------------- */

typedef td_status (*bin_fn)(td_tensor *, td_tensor *, td_tensor **);
typedef td_status (*un_fn)(td_tensor *, td_tensor **);

static td_status call_binary(td_tensor *const *in, const void *arg, td_tensor **out)
{
    return (*(const bin_fn *)arg)(in[0], in[1], out);
}

static td_status call_unary(td_tensor *const *in, const void *arg, td_tensor **out)
{
    return (*(const un_fn *)arg)(in[0], out);
}

static void check_binary(const char *what, bin_fn fn, td_shape sa, td_shape sb, double lo, double hi, double gap)
{
    uint64_t s = 7;
    td_tensor *in[2] = {ag_randn(sa, lo, hi, gap, true, &s), ag_randn(sb, lo, hi, gap, true, &s)};
    ag_gradcheck(what, call_binary, &fn, in, 2);
    td_tensor_release(in[0]);
    td_tensor_release(in[1]);
}

static void check_unary(const char *what, un_fn fn, td_shape sa, double lo, double hi, double gap)
{
    uint64_t s = 11;
    td_tensor *in[1] = {ag_randn(sa, lo, hi, gap, true, &s)};
    ag_gradcheck(what, call_unary, &fn, in, 1);
    td_tensor_release(in[0]);
}

static const td_shape binary_shapes[][2] = {
    {TD_SHAPE(3, 4), TD_SHAPE(3, 4)},       {TD_SHAPE(3, 4), TD_SHAPE(4)},   {TD_SHAPE(2, 1, 3), TD_SHAPE(4, 1)},
    {TD_SHAPE_SCALAR, TD_SHAPE(5)},         {TD_SHAPE(3, 1), TD_SHAPE(1, 2)}, {TD_SHAPE(6), TD_SHAPE_SCALAR},
};

TD_TEST(add_sub_mul_div_with_broadcasting)
{
    (void)ctx;
    for (size_t k = 0; k < sizeof binary_shapes / sizeof binary_shapes[0]; k++) {
        check_binary("add", td_autograd_add, binary_shapes[k][0], binary_shapes[k][1], -2, 2, 0);
        check_binary("sub", td_autograd_sub, binary_shapes[k][0], binary_shapes[k][1], -2, 2, 0);
        check_binary("mul", td_autograd_mul, binary_shapes[k][0], binary_shapes[k][1], -2, 2, 0);
        check_binary("div", td_autograd_div, binary_shapes[k][0], binary_shapes[k][1], -2, 2, 0.5);
        check_binary("pow", td_autograd_pow, binary_shapes[k][0], binary_shapes[k][1], 0.5, 2, 0);
    }
}

static td_status add_scalar_fn(td_tensor *a, td_tensor **out) { return td_autograd_add_scalar(a, 2.5, out); }
static td_status mul_scalar_fn(td_tensor *a, td_tensor **out) { return td_autograd_mul_scalar(a, -1.5, out); }
static td_status pow_25_fn(td_tensor *a, td_tensor **out) { return td_autograd_pow_scalar(a, 2.5, out); }
static td_status pow_3_fn(td_tensor *a, td_tensor **out) { return td_autograd_pow_scalar(a, 3, out); }
static td_status pow_0_fn(td_tensor *a, td_tensor **out) { return td_autograd_pow_scalar(a, 0, out); }

TD_TEST(unary_ops)
{
    (void)ctx;
    const td_shape shapes[] = {TD_SHAPE(5), TD_SHAPE(3, 4), TD_SHAPE(2, 3, 2), TD_SHAPE_SCALAR};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        check_unary("neg", td_autograd_neg, shapes[k], -2, 2, 0);
        check_unary("add_scalar", add_scalar_fn, shapes[k], -2, 2, 0);
        check_unary("mul_scalar", mul_scalar_fn, shapes[k], -2, 2, 0);
        check_unary("pow 2.5", pow_25_fn, shapes[k], 0.2, 2, 0);
        check_unary("pow 3", pow_3_fn, shapes[k], -2, 2, 0);
        check_unary("pow 0", pow_0_fn, shapes[k], -2, 2, 0);
        check_unary("exp", td_autograd_exp, shapes[k], -2, 2, 0);
        check_unary("log", td_autograd_log, shapes[k], 0.1, 3, 0);
        check_unary("relu", td_autograd_relu, shapes[k], -2, 2, 0.05);
        check_unary("tanh", td_autograd_tanh, shapes[k], -2, 2, 0);
        check_unary("sigmoid", td_autograd_sigmoid, shapes[k], -3, 3, 0);
    }
}

/* n float64 inputs of the given shapes, all requiring grad, through fn. */
static void check_n(const char *what, ag_fn fn, const void *arg, const td_shape *shapes, int n, double lo, double hi,
                    double gap)
{
    uint64_t s = 5;
    td_tensor *in[8] = {NULL};
    for (int i = 0; i < n; i++)
        in[i] = ag_randn(shapes[i], lo, hi, gap, true, &s);
    ag_gradcheck(what, fn, arg, in, n);
    for (int i = 0; i < n; i++)
        td_tensor_release(in[i]);
}

static td_status addmm_call(td_tensor *const *in, const void *arg, td_tensor **out)
{
    (void)arg;
    return td_autograd_addmm(in[0], in[1], in[2], out);
}

TD_TEST(matmul_mm_addmm)
{
    (void)ctx;
    const td_shape pairs[][2] = {{TD_SHAPE(2, 3), TD_SHAPE(3, 4)},
                                 {TD_SHAPE(3), TD_SHAPE(3, 4)},
                                 {TD_SHAPE(2, 3), TD_SHAPE(3)},
                                 {TD_SHAPE(3), TD_SHAPE(3)},
                                 {TD_SHAPE(1, 5), TD_SHAPE(5, 1)}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++)
        check_binary("matmul", td_autograd_matmul, pairs[k][0], pairs[k][1], -2, 2, 0);
    check_binary("mm", td_autograd_mm, TD_SHAPE(4, 3), TD_SHAPE(3, 2), -2, 2, 0);
    const td_shape biases[] = {TD_SHAPE(4), TD_SHAPE(2, 4), TD_SHAPE(1, 4), TD_SHAPE(2, 1), TD_SHAPE_SCALAR};
    for (size_t k = 0; k < sizeof biases / sizeof biases[0]; k++)
        check_n("addmm", addmm_call, NULL, (td_shape[]){biases[k], TD_SHAPE(2, 3), TD_SHAPE(3, 4)}, 3, -1, 1, 0);
}

/* ---- reductions, softmax, losses -------------------------------------------------------------- */

typedef struct dim_arg {
    int dim;
    bool keepdim;
} dim_arg;

static td_status sum_dim_call(td_tensor *const *in, const void *arg, td_tensor **out)
{
    const dim_arg *d = arg;
    return td_autograd_sum_dim(in[0], d->dim, d->keepdim, out);
}

static td_status mean_dim_call(td_tensor *const *in, const void *arg, td_tensor **out)
{
    const dim_arg *d = arg;
    return td_autograd_mean_dim(in[0], d->dim, d->keepdim, out);
}

static td_status softmax_call(td_tensor *const *in, const void *arg, td_tensor **out)
{
    return td_autograd_softmax(in[0], ((const dim_arg *)arg)->dim, out);
}

static td_status log_softmax_call(td_tensor *const *in, const void *arg, td_tensor **out)
{
    return td_autograd_log_softmax(in[0], ((const dim_arg *)arg)->dim, out);
}

TD_TEST(sum_mean_all_and_by_dim)
{
    (void)ctx;
    const td_shape shapes[] = {TD_SHAPE(5), TD_SHAPE(3, 4), TD_SHAPE(2, 3, 4), TD_SHAPE_SCALAR};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        check_unary("sum", td_autograd_sum, shapes[k], -2, 2, 0);
        check_unary("mean", td_autograd_mean, shapes[k], -2, 2, 0);
        for (int dim = -1; dim < shapes[k].ndim; dim++) {
            for (int keep = 0; keep < 2; keep++) {
                dim_arg d = {dim, keep != 0};
                check_n("sum_dim", sum_dim_call, &d, &shapes[k], 1, -2, 2, 0);
                check_n("mean_dim", mean_dim_call, &d, &shapes[k], 1, -2, 2, 0);
            }
        }
    }
}

TD_TEST(softmax_and_log_softmax)
{
    (void)ctx;
    const td_shape shapes[] = {TD_SHAPE(5), TD_SHAPE(3, 4), TD_SHAPE(2, 3, 4)};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        for (int dim = -1; dim < shapes[k].ndim; dim++) {
            dim_arg d = {dim, false};
            check_n("softmax", softmax_call, &d, &shapes[k], 1, -3, 3, 0);
            check_n("log_softmax", log_softmax_call, &d, &shapes[k], 1, -3, 3, 0);
        }
    }
}

typedef struct loss_arg {
    td_tensor *target;
    td_loss_reduction reduction;
    int64_t ignore_index;
    bool cross_entropy;
} loss_arg;

static td_status loss_call(td_tensor *const *in, const void *arg, td_tensor **out)
{
    const loss_arg *l = arg;
    return l->cross_entropy ? td_autograd_cross_entropy(in[0], l->target, l->reduction, l->ignore_index, out)
                            : td_autograd_nll_loss(in[0], l->target, l->reduction, l->ignore_index, out);
}

TD_TEST(nll_loss_and_cross_entropy)
{
    (void)ctx;
    int64_t classes[5] = {2, 0, 3, 1, 2};
    td_tensor *target, *target0;
    TD_CHECK_OK(td_tensor_from_buffer(TD_INT64, TD_SHAPE(5), classes, &target));
    TD_CHECK_OK(td_tensor_from_buffer(TD_INT64, TD_SHAPE_SCALAR, &classes[2], &target0));
    for (int ce = 0; ce < 2; ce++) {
        for (int r = 0; r < 3; r++) {
            for (int ign = 0; ign < 2; ign++) {
                loss_arg l = {target, (td_loss_reduction)r, ign ? 2 : -100, ce != 0};
                check_n(ce ? "cross_entropy" : "nll_loss", loss_call, &l, (td_shape[]){TD_SHAPE(5, 4)}, 1, -2, 2, 0);
            }
            loss_arg l0 = {target0, (td_loss_reduction)r, -100, ce != 0};
            check_n(ce ? "cross_entropy [C]" : "nll_loss [C]", loss_call, &l0, (td_shape[]){TD_SHAPE(4)}, 1, -2, 2, 0);
        }
    }
    /* The values themselves: cross_entropy of uniform logits is log(C). */
    td_tensor *logits, *loss;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT64, TD_SHAPE(5, 4), &logits));
    TD_CHECK_OK(td_autograd_cross_entropy(logits, target, TD_REDUCTION_MEAN, -100, &loss));
    TD_CHECK_NEAR(ag_at(loss, 0), log(4.0), 1e-12);
    td_tensor_release(loss);
    TD_CHECK_ERR(td_autograd_nll_loss(logits, target0, TD_REDUCTION_MEAN, -100, &loss), TD_ERR_INVALID,
                 "Expected input batch_size (5) to match target batch_size (1).");
    classes[1] = 7;
    td_tensor *bad;
    TD_CHECK_OK(td_tensor_from_buffer(TD_INT64, TD_SHAPE(5), classes, &bad));
    TD_CHECK_ERR(td_autograd_nll_loss(logits, bad, TD_REDUCTION_MEAN, -100, &loss), TD_ERR_INVALID,
                 "Target 7 is out of bounds.");
    td_tensor_release(bad);
    td_tensor_release(logits);
    td_tensor_release(target);
    td_tensor_release(target0);
}

/* ---- shape ops and embedding_bag -------------------------------------------------------------- */

typedef struct shape_arg {
    int kind; /* 0 reshape, 1 view, 2 transpose, 3 narrow, 4 reshape of a transposed view */
    td_shape shape;
    int d0, d1;
    int64_t start, length;
} shape_arg;

static td_status shape_call(td_tensor *const *in, const void *arg, td_tensor **out)
{
    const shape_arg *a = arg;
    td_tensor *t;
    td_status st;
    switch (a->kind) {
    case 0: return td_autograd_reshape(in[0], a->shape, out);
    case 1: return td_autograd_view(in[0], a->shape, out);
    case 2: return td_autograd_transpose(in[0], a->d0, a->d1, out);
    case 3: return td_autograd_narrow(in[0], a->d0, a->start, a->length, out);
    default:
        AG_TRY(td_autograd_transpose(in[0], 0, 1, &t));
        st = td_autograd_reshape(t, a->shape, out);
        td_tensor_release(t);
        return st;
    }
}

TD_TEST(reshape_view_transpose_narrow)
{
    (void)ctx;
    const td_shape s34[] = {TD_SHAPE(3, 4)}, s234[] = {TD_SHAPE(2, 3, 4)};
    shape_arg cases[] = {
        {0, TD_SHAPE(4, 3), 0, 0, 0, 0},  {0, TD_SHAPE(12), 0, 0, 0, 0},  {1, TD_SHAPE(2, 6), 0, 0, 0, 0},
        {1, TD_SHAPE(-1), 0, 0, 0, 0},    {2, TD_SHAPE(1), 0, 1, 0, 0},   {3, TD_SHAPE(1), 1, 0, 1, 2},
        {3, TD_SHAPE(1), 0, 0, 1, 2},     {3, TD_SHAPE(1), -1, 0, 2, 2},  {4, TD_SHAPE(12), 0, 0, 0, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        check_n("shape op", shape_call, &cases[k], s34, 1, -2, 2, 0);
    shape_arg t3[] = {{2, TD_SHAPE(1), 0, 2, 0, 0}, {3, TD_SHAPE(1), 2, 0, 1, 3}, {0, TD_SHAPE(6, 4), 0, 0, 0, 0}};
    for (size_t k = 0; k < sizeof t3 / sizeof t3[0]; k++)
        check_n("shape op 3-D", shape_call, &t3[k], s234, 1, -2, 2, 0);
}

static td_status cat_call(td_tensor *const *in, const void *arg, td_tensor **out)
{
    const int *dim = arg;
    return td_autograd_cat(in, 3, *dim, out);
}

TD_TEST(cat_along_each_dim)
{
    (void)ctx;
    int dim0 = 0, dim1 = 1, dimm1 = -1;
    check_n("cat dim 0", cat_call, &dim0, (td_shape[]){TD_SHAPE(2, 3), TD_SHAPE(1, 3), TD_SHAPE(4, 3)}, 3, -2, 2, 0);
    check_n("cat dim 1", cat_call, &dim1, (td_shape[]){TD_SHAPE(2, 3), TD_SHAPE(2, 1), TD_SHAPE(2, 2)}, 3, -2, 2, 0);
    check_n("cat dim -1", cat_call, &dimm1, (td_shape[]){TD_SHAPE(4), TD_SHAPE(2), TD_SHAPE(3)}, 3, -2, 2, 0);
    /* A 1-D empty input is skipped by cat and gets no gradient. */
    uint64_t s = 1;
    td_tensor *in[3] = {ag_randn(TD_SHAPE(2, 3), -1, 1, 0, true, &s), ag_randn(TD_SHAPE(0), -1, 1, 0, false, &s),
                        ag_randn(TD_SHAPE(1, 3), -1, 1, 0, true, &s)};
    ag_gradcheck("cat with an empty input", cat_call, &dim0, in, 3);
    for (int i = 0; i < 3; i++)
        td_tensor_release(in[i]);
}

typedef struct bag_arg {
    td_tensor *indices, *offsets;
    td_embedding_bag_mode mode;
} bag_arg;

static td_status bag_call(td_tensor *const *in, const void *arg, td_tensor **out)
{
    const bag_arg *b = arg;
    return td_autograd_embedding_bag(in[0], b->indices, b->offsets, b->mode, out);
}

TD_TEST(embedding_bag_sum_and_mean)
{
    (void)ctx;
    int64_t idx[7] = {1, 4, 4, 0, 2, 3, 1}, off[4] = {0, 3, 3, 5}; /* bag 1 is empty; index 4 twice */
    int64_t idx2[6] = {0, 2, 4, 4, 1, 3};
    td_tensor *indices, *offsets, *indices2;
    TD_CHECK_OK(td_tensor_from_buffer(TD_INT64, TD_SHAPE(7), idx, &indices));
    TD_CHECK_OK(td_tensor_from_buffer(TD_INT64, TD_SHAPE(4), off, &offsets));
    TD_CHECK_OK(td_tensor_from_buffer(TD_INT64, TD_SHAPE(3, 2), idx2, &indices2));
    for (int mode = 0; mode < 2; mode++) {
        bag_arg a = {indices, offsets, (td_embedding_bag_mode)mode};
        check_n("embedding_bag 1-D", bag_call, &a, (td_shape[]){TD_SHAPE(5, 3)}, 1, -2, 2, 0);
        bag_arg b = {indices2, NULL, (td_embedding_bag_mode)mode};
        check_n("embedding_bag 2-D", bag_call, &b, (td_shape[]){TD_SHAPE(5, 3)}, 1, -2, 2, 0);
    }
    /* Values: bag 0 of the mean mode is the mean of rows 1, 4, 4; the empty bag is zeros. */
    double wv[15];
    for (int i = 0; i < 15; i++)
        wv[i] = i;
    td_tensor *w, *out;
    TD_CHECK_OK(td_tensor_from_buffer(TD_FLOAT64, TD_SHAPE(5, 3), wv, &w));
    TD_CHECK_OK(td_autograd_embedding_bag(w, indices, offsets, TD_EMBEDDING_BAG_MEAN, &out));
    TD_CHECK_NEAR(ag_at(out, 0), (3 + 12 + 12) / 3.0, 1e-12);
    TD_CHECK_NEAR(ag_at(out, 3), 0, 0);
    td_tensor_release(out);
    idx[2] = 9;
    td_tensor *bad;
    TD_CHECK_OK(td_tensor_from_buffer(TD_INT64, TD_SHAPE(7), idx, &bad));
    TD_CHECK_ERR(td_autograd_embedding_bag(w, bad, offsets, TD_EMBEDDING_BAG_SUM, &out), TD_ERR_INVALID,
                 "index 9 is out of bounds for dimension 0 with size 5");
    td_tensor_release(bad);
    td_tensor_release(w);
    td_tensor_release(indices);
    td_tensor_release(offsets);
    td_tensor_release(indices2);
}

/* ---- composites: a tensor used twice, a small network ----------------------------------------- */

static td_status reuse_call(td_tensor *const *in, const void *arg, td_tensor **out)
{
    (void)arg;
    /* x * x + exp(x) * y + x, with y broadcast */
    td_tensor *xx, *ex, *exy, *s;
    AG_TRY(td_autograd_mul(in[0], in[0], &xx));
    AG_TRY(td_autograd_exp(in[0], &ex));
    AG_TRY(td_autograd_mul(ex, in[1], &exy));
    AG_TRY(td_autograd_add(xx, exy, &s));
    td_status st = td_autograd_add(s, in[0], out);
    td_tensor_release(xx);
    td_tensor_release(ex);
    td_tensor_release(exy);
    td_tensor_release(s);
    return st;
}

static td_status net_call(td_tensor *const *in, const void *arg, td_tensor **out)
{
    const td_tensor *target = arg;
    td_tensor *h, *a, *logits, *sig, *t;
    AG_TRY(td_autograd_addmm(in[2], in[0], in[1], &h));
    AG_TRY(td_autograd_tanh(h, &a));
    AG_TRY(td_autograd_matmul(a, in[3], &logits));
    AG_TRY(td_autograd_sigmoid(logits, &sig));
    AG_TRY(td_autograd_mul(logits, sig, &t));
    td_status st = td_autograd_cross_entropy(t, (td_tensor *)target, TD_REDUCTION_MEAN, -100, out);
    td_tensor_release(h);
    td_tensor_release(a);
    td_tensor_release(logits);
    td_tensor_release(sig);
    td_tensor_release(t);
    return st;
}

TD_TEST(composite_graphs)
{
    (void)ctx;
    check_n("reuse", reuse_call, NULL, (td_shape[]){TD_SHAPE(3, 4), TD_SHAPE(4)}, 2, -1, 1, 0);
    int64_t cls[4] = {0, 2, 1, 2};
    td_tensor *target;
    TD_CHECK_OK(td_tensor_from_buffer(TD_INT64, TD_SHAPE(4), cls, &target));
    check_n("net", net_call, target, (td_shape[]){TD_SHAPE(4, 5), TD_SHAPE(5, 6), TD_SHAPE(6), TD_SHAPE(6, 3)}, 4, -1,
            1, 0);
    td_tensor_release(target);
}

/* ---- other dtypes ----------------------------------------------------------------------------- */

/* The net's gradients in dtype against float64's, within tol. */
static void net_in_dtype(td_dtype dtype, double tol)
{
    uint64_t s = 21;
    const td_shape shapes[4] = {TD_SHAPE(4, 5), TD_SHAPE(5, 6), TD_SHAPE(6), TD_SHAPE(6, 3)};
    int64_t cls[4] = {0, 2, 1, 2};
    td_tensor *target, *ref[4], *low[4], *loss;
    TD_CHECK_OK(td_tensor_from_buffer(TD_INT64, TD_SHAPE(4), cls, &target));
    for (int i = 0; i < 4; i++) {
        ref[i] = ag_randn(shapes[i], -1, 1, 0, true, &s);
        TD_CHECK_OK(td_tensor_to(ref[i], dtype, &low[i]));
        TD_CHECK_OK(td_autograd_set_requires_grad(low[i], true));
    }
    TD_CHECK_OK(net_call(ref, target, &loss));
    TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
    td_tensor_release(loss);
    TD_CHECK_OK(net_call(low, target, &loss));
    TD_CHECK_EQ(td_tensor_dtype(loss), dtype);
    TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
    td_tensor_release(loss);
    for (int i = 0; i < 4; i++) {
        td_tensor *gr = td_autograd_get_grad(ref[i]), *gl = td_autograd_get_grad(low[i]);
        TD_CHECK(gr && gl);
        TD_CHECK_EQ(td_tensor_dtype(gl), dtype);
        for (int64_t k = 0; k < td_tensor_numel(gr); k++)
            TD_CHECK_MSG(fabs(ag_at(gr, k) - ag_at(gl, k)) <= tol, "%s input %d [%lld]: %g vs float64 %g",
                         td_dtype_name(dtype), i, (long long)k, ag_at(gl, k), ag_at(gr, k));
        td_tensor_release(gr);
        td_tensor_release(gl);
        td_tensor_release(ref[i]);
        td_tensor_release(low[i]);
    }
    td_tensor_release(target);
}

TD_TEST(float32_float16_bfloat16_match_float64)
{
    (void)ctx;
    net_in_dtype(TD_FLOAT32, 1e-6);
    net_in_dtype(TD_FLOAT16, 1e-2);
    net_in_dtype(TD_BFLOAT16, 5e-2);
}

TD_TEST(mixed_dtypes_give_each_input_its_dtype)
{
    (void)ctx;
    uint64_t s = 4;
    td_tensor *a64 = ag_randn(TD_SHAPE(3), -1, 1, 0, false, &s), *a32, *b = ag_randn(TD_SHAPE(3), -1, 1, 0, true, &s);
    TD_CHECK_OK(td_tensor_to(a64, TD_FLOAT32, &a32));
    TD_CHECK_OK(td_autograd_set_requires_grad(a32, true));
    td_tensor *prod, *loss;
    TD_CHECK_OK(td_autograd_mul(a32, b, &prod));
    TD_CHECK_EQ(td_tensor_dtype(prod), TD_FLOAT64);
    TD_CHECK_OK(td_autograd_sum(prod, &loss));
    TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
    td_tensor *ga = td_autograd_get_grad(a32), *gb = td_autograd_get_grad(b);
    TD_CHECK_EQ(td_tensor_dtype(ga), TD_FLOAT32);
    TD_CHECK_EQ(td_tensor_dtype(gb), TD_FLOAT64);
    for (int64_t k = 0; k < 3; k++) {
        TD_CHECK_NEAR(ag_at(ga, k), ag_at(b, k), 1e-6);
        TD_CHECK_NEAR(ag_at(gb, k), ag_at(a32, k), 0);
    }
    td_tensor_release(ga);
    td_tensor_release(gb);
    td_tensor_release(prod);
    td_tensor_release(loss);
    td_tensor_release(a64);
    td_tensor_release(a32);
    td_tensor_release(b);
}

TD_TEST_MAIN()
