/* The forward ops autograd added to tensor.h (src/tensor/math.c) against reference loops over
 * libm in double: exp, log, tanh, sigmoid, relu, pow, sum / mean by dim, sum_to_size, softmax,
 * log_softmax, addmm, nll_loss and embedding_bag values, in float64, float32 and float16 (rounded
 * once from the float32 computation), on non-contiguous inputs too, and their argument errors. */
#include <math.h>
#include <string.h>

#include "ag_util.h"

typedef td_status (*un_fn)(const td_tensor *, td_tensor **);

static double sigmoid_ref(double x) { return 1 / (1 + exp(-x)); }
static double relu_ref(double x) { return x > 0 ? x : 0; }

/* fn over a transposed (non-contiguous) 3x4 input of dtype against ref elementwise. */
static void check_unary(un_fn fn, double (*ref)(double), td_dtype dtype, double lo, double hi, double tol)
{
    uint64_t s = 17;
    td_tensor *base = ag_randn(TD_SHAPE(4, 3), lo, hi, 0.01, false, &s), *cast, *t, *out;
    TD_CHECK_OK(td_tensor_to(base, dtype, &cast));
    TD_CHECK_OK(td_tensor_transpose(cast, 0, 1, &t));
    TD_CHECK_OK(fn(t, &out));
    TD_CHECK_EQ(td_tensor_dtype(out), dtype);
    TD_CHECK(td_tensor_is_contiguous(out));
    for (int64_t k = 0; k < 12; k++) {
        double x = ag_at(t, k), want = ref(x), got = ag_at(out, k);
        TD_CHECK_MSG(fabs(got - want) <= tol * (1 + fabs(want)), "%s element %lld: f(%g) = %g, want %g",
                     td_dtype_name(dtype), (long long)k, x, got, want);
    }
    td_tensor_release(out);
    td_tensor_release(t);
    td_tensor_release(cast);
    td_tensor_release(base);
}

TD_TEST(elementwise_math_values)
{
    (void)ctx;
    const td_dtype dts[] = {TD_FLOAT64, TD_FLOAT32, TD_FLOAT16, TD_BFLOAT16};
    const double tols[] = {1e-15, 1e-6, 2e-3, 1e-2};
    for (int i = 0; i < 4; i++) {
        check_unary(td_tensor_exp, exp, dts[i], -2, 2, tols[i]);
        check_unary(td_tensor_log, log, dts[i], 0.1, 4, tols[i]);
        check_unary(td_tensor_tanh, tanh, dts[i], -2, 2, tols[i]);
        check_unary(td_tensor_sigmoid, sigmoid_ref, dts[i], -3, 3, tols[i]);
        check_unary(td_tensor_relu, relu_ref, dts[i], -2, 2, 0);
    }
    td_tensor *nan, *out, *ints;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT32, TD_SHAPE(2), NAN, &nan));
    TD_CHECK_OK(td_tensor_relu(nan, &out));
    TD_CHECK(isnan(ag_at(out, 0)));
    td_tensor_release(out);
    td_tensor_release(nan);
    TD_CHECK_OK(td_tensor_zeros(TD_INT32, TD_SHAPE(2), &ints));
    TD_CHECK_ERR(td_tensor_exp(ints, &out), TD_ERR_INVALID, "exp: expected a floating point tensor");
    td_tensor_release(ints);
    /* pow: scalar and broadcast tensor exponents */
    uint64_t s = 2;
    td_tensor *a = ag_randn(TD_SHAPE(2, 3), 0.5, 2, 0, false, &s), *b = ag_randn(TD_SHAPE(3), -1, 2, 0, false, &s);
    TD_CHECK_OK(td_tensor_pow_scalar(a, 2.5, &out));
    TD_CHECK_NEAR(ag_at(out, 4), pow(ag_at(a, 4), 2.5), 1e-14);
    td_tensor_release(out);
    TD_CHECK_OK(td_tensor_pow(a, b, &out));
    TD_CHECK_EQ(td_tensor_ndim(out), 2);
    TD_CHECK_NEAR(ag_at(out, 4), pow(ag_at(a, 4), ag_at(b, 1)), 1e-14);
    td_tensor_release(out);
    td_tensor_release(a);
    td_tensor_release(b);
}

TD_TEST(reductions_and_softmax_values)
{
    (void)ctx;
    double v[24];
    for (int i = 0; i < 24; i++)
        v[i] = i * 0.5 - 3;
    td_tensor *t, *out;
    TD_CHECK_OK(td_tensor_from_buffer(TD_FLOAT64, TD_SHAPE(2, 3, 4), v, &t));
    TD_CHECK_OK(td_tensor_sum_dim(t, 1, false, &out)); /* [2, 4] */
    TD_CHECK_EQ(td_tensor_ndim(out), 2);
    TD_CHECK_NEAR(ag_at(out, 5), v[13] + v[17] + v[21], 1e-15);
    td_tensor_release(out);
    TD_CHECK_OK(td_tensor_mean_dim(t, -1, true, &out)); /* [2, 3, 1] */
    TD_CHECK_EQ(td_tensor_sizes(out)[2], 1);
    TD_CHECK_NEAR(ag_at(out, 1), (v[4] + v[5] + v[6] + v[7]) / 4, 1e-15);
    td_tensor_release(out);
    TD_CHECK_OK(td_tensor_mean(t, &out));
    TD_CHECK_EQ(td_tensor_ndim(out), 0);
    TD_CHECK_NEAR(ag_at(out, 0), 2.75, 1e-15);
    td_tensor_release(out);
    TD_CHECK_OK(td_tensor_sum_to_size(t, TD_SHAPE(3, 1), &out));
    TD_CHECK_NEAR(ag_at(out, 2), v[8] + v[9] + v[10] + v[11] + v[20] + v[21] + v[22] + v[23], 1e-13);
    td_tensor_release(out);
    TD_CHECK_ERR(td_tensor_sum_to_size(t, TD_SHAPE(5), &out), TD_ERR_INVALID,
                 "size {[5]} is not expandable to size {[2, 3, 4]}.");
    TD_CHECK_OK(td_tensor_softmax(t, 1, &out));
    double denom = exp(v[1]) + exp(v[5]) + exp(v[9]);
    TD_CHECK_NEAR(ag_at(out, 5), exp(v[5]) / denom, 1e-15);
    td_tensor_release(out);
    TD_CHECK_OK(td_tensor_log_softmax(t, 1, &out));
    TD_CHECK_NEAR(ag_at(out, 5), v[5] - log(denom), 1e-14);
    td_tensor_release(out);
    /* large inputs stay finite (max subtracted) */
    td_tensor *big;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT32, TD_SHAPE(3), 1000, &big));
    TD_CHECK_OK(td_tensor_softmax(big, 0, &out));
    TD_CHECK_NEAR(ag_at(out, 0), 1.0 / 3, 1e-7);
    td_tensor_release(out);
    td_tensor_release(big);
    td_tensor_release(t);
}

TD_TEST(addmm_nll_loss_embedding_bag_values)
{
    (void)ctx;
    double a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1}, bias[2] = {10, 20}, bias2[2] = {1, 2};
    td_tensor *ta, *tb, *tbias, *tbias2, *out;
    TD_CHECK_OK(td_tensor_from_buffer(TD_FLOAT64, TD_SHAPE(2, 3), a, &ta));
    TD_CHECK_OK(td_tensor_from_buffer(TD_FLOAT64, TD_SHAPE(3, 2), b, &tb));
    TD_CHECK_OK(td_tensor_from_buffer(TD_FLOAT64, TD_SHAPE(2), bias, &tbias));
    TD_CHECK_OK(td_tensor_from_buffer(TD_FLOAT64, TD_SHAPE(2, 1), bias2, &tbias2));
    TD_CHECK_OK(td_tensor_addmm(tbias, ta, tb, 1, 1, &out)); /* [[4, 5], [10, 11]] + bias */
    const double want[4] = {14, 25, 20, 31};
    for (int k = 0; k < 4; k++)
        TD_CHECK_NEAR(ag_at(out, k), want[k], 0);
    td_tensor_release(out);
    TD_CHECK_OK(td_tensor_addmm(tbias2, ta, tb, 0.5, 2, &out)); /* 2 * prod + 0.5 * column bias */
    const double want2[4] = {8.5, 10.5, 21, 23};
    for (int k = 0; k < 4; k++)
        TD_CHECK_NEAR(ag_at(out, k), want2[k], 0);
    td_tensor_release(out);
    td_tensor *wrong;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT64, TD_SHAPE(3), &wrong));
    TD_CHECK_ERR(td_tensor_addmm(wrong, ta, tb, 1, 1, &out), TD_ERR_INVALID, NULL);
    td_tensor_release(wrong);
    /* nll_loss: -input[i, target[i]], mean over the rows not ignored */
    int64_t tg[2] = {2, 0};
    td_tensor *target;
    TD_CHECK_OK(td_tensor_from_buffer(TD_INT64, TD_SHAPE(2), tg, &target));
    TD_CHECK_OK(td_tensor_nll_loss(ta, target, TD_REDUCTION_MEAN, -100, &out));
    TD_CHECK_NEAR(ag_at(out, 0), -(3 + 4) / 2.0, 0);
    td_tensor_release(out);
    TD_CHECK_OK(td_tensor_nll_loss(ta, target, TD_REDUCTION_MEAN, 0, &out));
    TD_CHECK_NEAR(ag_at(out, 0), -3, 0);
    td_tensor_release(out);
    TD_CHECK_OK(td_tensor_nll_loss(ta, target, TD_REDUCTION_NONE, -100, &out));
    TD_CHECK_NEAR(ag_at(out, 1), -4, 0);
    td_tensor_release(out);
    /* embedding_bag: bags [0, 1], [], [1] over the rows of b */
    int64_t idx[3] = {0, 1, 1}, off[3] = {0, 2, 2};
    td_tensor *ti, *to;
    TD_CHECK_OK(td_tensor_from_buffer(TD_INT64, TD_SHAPE(3), idx, &ti));
    TD_CHECK_OK(td_tensor_from_buffer(TD_INT64, TD_SHAPE(3), off, &to));
    TD_CHECK_OK(td_tensor_embedding_bag(tb, ti, to, TD_EMBEDDING_BAG_SUM, &out));
    const double bag[6] = {1, 1, 0, 0, 0, 1};
    for (int k = 0; k < 6; k++)
        TD_CHECK_NEAR(ag_at(out, k), bag[k], 0);
    td_tensor_release(out);
    TD_CHECK_ERR(td_tensor_embedding_bag(tb, ti, NULL, TD_EMBEDDING_BAG_SUM, &out), TD_ERR_INVALID,
                 "offsets has to be a 1D Tensor but got None");
    td_tensor *release[] = {ta, tb, tbias, tbias2, target, ti, to};
    for (size_t i = 0; i < sizeof release / sizeof release[0]; i++)
        td_tensor_release(release[i]);
}

TD_TEST_MAIN()
