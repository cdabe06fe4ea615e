/* Tensor arithmetic (src/tensor/ops.c) against values worked out by hand or by reference loops in
 * this file: broadcasting and its error, torch.result_type promotion across dims / 0-dim / scalar
 * operands, each dtype group (bool, integers with wraparound, float16/bfloat16 rounding, float32/64,
 * complex), true division, views (transposed, narrowed, expanded) as inputs, neg, sum, matmul
 * (dot, mv, vector-matrix, mm) with torch's shape errors, nonzero and eq. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/testing.h>

#include "tensor_util.h"

/* ---- helpers --------------------------------------------------------------------------------- */

static void check_values(const td_tensor *t, td_dtype dt, td_shape shape, const double *want)
{
    TD_CHECK_STR_EQ(td_dtype_name(td_tensor_dtype(t)), td_dtype_name(dt));
    TD_CHECK_EQ(td_tensor_ndim(t), shape.ndim);
    for (int i = 0; i < shape.ndim; i++)
        TD_CHECK_EQ(td_tensor_sizes(t)[i], shape.d[i]);
    int64_t n = td_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        double got = value_at(t, i);
        if (isnan(want[i]))
            TD_CHECK_MSG(isnan(got), "element %lld: want nan, got %.17g", (long long)i, got);
        else
            TD_CHECK_MSG(got == want[i] && signbit(got) == signbit(want[i]), "element %lld: want %.17g, got %.17g",
                         (long long)i, want[i], got);
    }
}

static int64_t int_at(const td_tensor *t, int64_t flat)
{
    int nd = td_tensor_ndim(t);
    int64_t idx[TD_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = flat % td_tensor_sizes(t)[d];
        flat /= td_tensor_sizes(t)[d];
    }
    int64_t v;
    TD_CHECK_OK(td_tensor_get_i64(t, idx, &v));
    return v;
}

/* The element at a flat row-major position, as a complex number. */
static void complex_at(const td_tensor *t, int64_t flat, double *re, double *im)
{
    int nd = td_tensor_ndim(t);
    int64_t idx[TD_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = flat % td_tensor_sizes(t)[d];
        flat /= td_tensor_sizes(t)[d];
    }
    TD_CHECK_OK(td_tensor_get_complex(t, nd ? idx : NULL, re, im));
}

typedef td_status (*binary_fn)(const td_tensor *, const td_tensor *, td_tensor **);
typedef td_status (*scalar_fn)(const td_tensor *, td_scalar, td_tensor **);

/* ---- broadcasting ---------------------------------------------------------------------------- */

TD_TEST(binary_ops_broadcast_like_torch)
{
    /* a [2, 1, 3] (0..5), b [4, 1] (10, 20, 30, 40): a + b is [2, 4, 3] with a[i,0,k] + b[j,0]. */
    td_tensor *a, *b, *r;
    TD_CHECK_OK(td_tensor_arange(TD_FLOAT64, 0, 6, 1, &a));
    td_tensor *a3;
    TD_CHECK_OK(td_tensor_view(a, TD_SHAPE(2, 1, 3), &a3));
    b = tensor_of(TD_FLOAT64, TD_SHAPE(4, 1), (double[]){10, 20, 30, 40});
    TD_CHECK_OK(td_tensor_add(a3, b, &r));
    double want[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 3; k++)
                want[(i * 4 + j) * 3 + k] = (i * 3 + k) + (j + 1) * 10.0;
    check_values(r, TD_FLOAT64, TD_SHAPE(2, 4, 3), want);
    TD_CHECK(td_tensor_is_contiguous(r));
    td_tensor_release(r);

    /* b - a the other way round: [4, 1] - [2, 1, 3]. */
    TD_CHECK_OK(td_tensor_sub(b, a3, &r));
    for (int i = 0; i < 24; i++)
        want[i] = (double)((i / 3 % 4 + 1) * 10) - (double)((i / 12) * 3 + i % 3);
    check_values(r, TD_FLOAT64, TD_SHAPE(2, 4, 3), want);
    td_tensor_release(r);

    /* With a 0-dim tensor and with an empty dim. */
    td_tensor *s = tensor_of(TD_FLOAT64, TD_SHAPE_SCALAR, (double[]){2});
    TD_CHECK_OK(td_tensor_mul(s, a3, &r));
    check_values(r, TD_FLOAT64, TD_SHAPE(2, 1, 3), (double[]){0, 2, 4, 6, 8, 10});
    td_tensor_release(r);
    td_tensor *e;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT64, TD_SHAPE(0, 1), &e));
    td_tensor *row = tensor_of(TD_FLOAT64, TD_SHAPE(3), (double[]){1, 2, 3});
    TD_CHECK_OK(td_tensor_add(e, row, &r)); /* [0, 1] with [3]: [0, 3] */
    TD_CHECK_EQ(td_tensor_numel(r), 0);
    TD_CHECK_EQ(td_tensor_ndim(r), 2);
    TD_CHECK(td_tensor_sizes(r)[0] == 0 && td_tensor_sizes(r)[1] == 3);
    td_tensor_release(r);
    TD_CHECK_ERR(td_tensor_add(e, b, &r), TD_ERR_INVALID, "tensor a (0) must match the size of tensor b (4)");
    td_tensor_release(row);
    td_tensor_release(e);
    td_tensor_release(s);
    td_tensor_release(a3);
    td_tensor_release(a);
    td_tensor_release(b);
}

TD_TEST(mismatched_shapes_fail_with_torch_message)
{
    td_tensor *a, *b, *c, *r = NULL;
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(2, 3), &a));
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(4), &b));
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(3, 1, 5), &c));
    TD_CHECK_ERR(td_tensor_add(a, b, &r), TD_ERR_INVALID,
                 "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1");
    /* Dims are checked from the last, as at::infer_size does. */
    TD_CHECK_ERR(td_tensor_mul(c, a, &r), TD_ERR_INVALID,
                 "The size of tensor a (5) must match the size of tensor b (3) at non-singleton dimension 2");
    TD_CHECK_ERR(td_tensor_eq(a, c, &r), TD_ERR_INVALID,
                 "The size of tensor a (3) must match the size of tensor b (5) at non-singleton dimension 2");
    td_tensor *d;
    TD_CHECK_OK(td_tensor_ones(TD_INT64, TD_SHAPE(2, 1, 5), &d));
    TD_CHECK_ERR(td_tensor_div(c, d, &r), TD_ERR_INVALID,
                 "The size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 0");
    TD_CHECK_ERR(td_tensor_sub_scalar(NULL, td_scalar_int(1), &r), TD_ERR_INVALID, "is NULL");
    td_tensor_release(d);
    TD_CHECK(r == NULL);
    TD_CHECK_ERR(td_tensor_add(a, NULL, &r), TD_ERR_INVALID, "is NULL");
    td_tensor_release(a);
    td_tensor_release(b);
    td_tensor_release(c);
}

/* ---- promotion ------------------------------------------------------------------------------- */

TD_TEST(result_type_follows_torch_promotion)
{
    static const struct {
        td_dtype a, b;
        int a_ndim, b_ndim;
        td_dtype want;
    } cases[] = {
        {TD_INT32, TD_INT32, 1, 1, TD_INT32},
        {TD_INT32, TD_FLOAT32, 1, 1, TD_FLOAT32},
        {TD_INT64, TD_FLOAT16, 1, 1, TD_FLOAT16},
        {TD_BOOL, TD_INT8, 1, 1, TD_INT8},
        {TD_BOOL, TD_BOOL, 1, 1, TD_BOOL},
        {TD_UINT8, TD_INT8, 1, 1, TD_INT16},
        {TD_FLOAT16, TD_BFLOAT16, 1, 1, TD_FLOAT32},
        {TD_INT64, TD_COMPLEX64, 1, 1, TD_COMPLEX64},
        {TD_FLOAT64, TD_COMPLEX64, 1, 1, TD_COMPLEX128},
        /* 0-dim tensors rank below tensors with dims unless their category is higher. */
        {TD_FLOAT32, TD_FLOAT64, 1, 0, TD_FLOAT32},
        {TD_INT32, TD_INT64, 2, 0, TD_INT32},
        {TD_INT32, TD_FLOAT64, 1, 0, TD_FLOAT64},
        {TD_FLOAT32, TD_COMPLEX128, 1, 0, TD_COMPLEX64},
        {TD_FLOAT64, TD_COMPLEX64, 1, 0, TD_COMPLEX128},
        {TD_BOOL, TD_INT16, 1, 0, TD_INT16},
        {TD_FLOAT64, TD_FLOAT32, 0, 0, TD_FLOAT64},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        td_tensor *a, *b, *r;
        TD_CHECK_OK(td_tensor_ones(cases[i].a, cases[i].a_ndim ? TD_SHAPE(2) : TD_SHAPE_SCALAR, &a));
        TD_CHECK_OK(td_tensor_ones(cases[i].b, cases[i].b_ndim ? TD_SHAPE(2) : TD_SHAPE_SCALAR, &b));
        TD_CHECK_MSG(td_tensor_result_type(a, b) == cases[i].want && td_tensor_result_type(b, a) == cases[i].want,
                     "case %zu: %s with %s gives %s, want %s", i, td_dtype_name(cases[i].a),
                     td_dtype_name(cases[i].b), td_dtype_name(td_tensor_result_type(a, b)),
                     td_dtype_name(cases[i].want));
        TD_CHECK_OK(td_tensor_add(a, b, &r));
        TD_CHECK_EQ(td_tensor_dtype(r), cases[i].want);
        double re, im;
        complex_at(r, 0, &re, &im);
        TD_CHECK_MSG(re == (cases[i].want == TD_BOOL ? 1 : 2) && im == 0, "case %zu: 1 + 1 = %g%+gj", i, re, im);
        td_tensor_release(r);
        td_tensor_release(a);
        td_tensor_release(b);
    }
}

TD_TEST(scalar_operands_promote_as_python_numbers)
{
    td_tensor *i32 = tensor_of(TD_INT32, TD_SHAPE(3), (double[]){1, -2, 7});
    td_tensor *r;
    /* int tensor + int stays int. */
    TD_CHECK_OK(td_tensor_add_scalar(i32, td_scalar_int(3), &r));
    check_values(r, TD_INT32, TD_SHAPE(3), (double[]){4, 1, 10});
    td_tensor_release(r);
    /* int tensor + float is the default float dtype. */
    TD_CHECK_OK(td_tensor_add_scalar(i32, td_scalar_float(0.5), &r));
    check_values(r, TD_FLOAT32, TD_SHAPE(3), (double[]){1.5, -1.5, 7.5});
    td_tensor_release(r);
    /* int tensor * complex is complex64. */
    TD_CHECK_OK(td_tensor_mul_scalar(i32, td_scalar_complex(0, 1), &r));
    TD_CHECK_EQ(td_tensor_dtype(r), TD_COMPLEX64);
    double re, im;
    complex_at(r, 1, &re, &im);
    TD_CHECK(re == 0 && im == -2);
    td_tensor_release(r);
    /* int * bool stays int: bool scalars count as bool. */
    TD_CHECK_OK(td_tensor_mul_scalar(i32, td_scalar_bool(true), &r));
    check_values(r, TD_INT32, TD_SHAPE(3), (double[]){1, -2, 7});
    td_tensor_release(r);
    td_tensor_release(i32);

    /* A float16 tensor keeps its dtype with a float scalar, which rounds to float16 first. */
    td_tensor *h = tensor_of(TD_FLOAT16, TD_SHAPE(2), (double[]){1, 2048});
    TD_CHECK_OK(td_tensor_add_scalar(h, td_scalar_float(1.0001), &r));
    check_values(r, TD_FLOAT16, TD_SHAPE(2), (double[]){2, 2048}); /* 2049 is a tie: to even */
    td_tensor_release(r);
    td_tensor_release(h);

    /* bool + int is int64; bool + bool stays bool (add is or, mul is and). */
    td_tensor *bt = tensor_of(TD_BOOL, TD_SHAPE(2), (double[]){0, 1});
    TD_CHECK_OK(td_tensor_add_scalar(bt, td_scalar_int(3), &r));
    check_values(r, TD_INT64, TD_SHAPE(2), (double[]){3, 4});
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_add_scalar(bt, td_scalar_bool(true), &r));
    check_values(r, TD_BOOL, TD_SHAPE(2), (double[]){1, 1});
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_mul_scalar(bt, td_scalar_bool(true), &r));
    check_values(r, TD_BOOL, TD_SHAPE(2), (double[]){0, 1});
    td_tensor_release(r);
    td_tensor_release(bt);

    /* float64 tensor with a complex scalar is complex128; float32's is complex64. */
    td_tensor *d = tensor_of(TD_FLOAT64, TD_SHAPE(1), (double[]){0.1});
    TD_CHECK_OK(td_tensor_add_scalar(d, td_scalar_complex(0.2, 1), &r));
    TD_CHECK_EQ(td_tensor_dtype(r), TD_COMPLEX128);
    complex_at(r, 0, &re, &im);
    TD_CHECK(re == 0.1 + 0.2 && im == 1);
    td_tensor_release(r);
    td_tensor_release(d);

    /* An int scalar converts to an int8 tensor's dtype (wrapping), and the sum wraps. */
    td_tensor *i8 = tensor_of(TD_INT8, TD_SHAPE(2), (double[]){100, -100});
    TD_CHECK_OK(td_tensor_add_scalar(i8, td_scalar_int(100), &r));
    check_values(r, TD_INT8, TD_SHAPE(2), (double[]){-56, 0});
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_sub_scalar(i8, td_scalar_int(-300), &r)); /* -300 wraps to -44 in int8 */
    check_values(r, TD_INT8, TD_SHAPE(2), (double[]){(int8_t)(100 + 44), -56});
    td_tensor_release(r);
    td_tensor_release(i8);
}

/* ---- dtype groups ---------------------------------------------------------------------------- */

TD_TEST(integer_arithmetic_wraps_in_each_dtype)
{
    static const td_dtype ints[] = {TD_UINT8, TD_INT8, TD_INT16, TD_INT32, TD_INT64};
    for (size_t d = 0; d < sizeof ints / sizeof ints[0]; d++) {
        td_dtype dt = ints[d];
        int bits = (int)td_dtype_size(dt) * 8;
        td_tensor *a = tensor_of(dt, TD_SHAPE(4), (double[]){0, 5, 12, 100});
        td_tensor *b = tensor_of(dt, TD_SHAPE(4), (double[]){3, 5, 2, 7});
        td_tensor *r;
        TD_CHECK_OK(td_tensor_add(a, b, &r));
        check_values(r, dt, TD_SHAPE(4), (double[]){3, 10, 14, 107});
        td_tensor_release(r);
        TD_CHECK_OK(td_tensor_mul(a, b, &r));
        double prod100 = dt == TD_INT8 ? (int8_t)700 : dt == TD_UINT8 ? (uint8_t)700 : 700;
        check_values(r, dt, TD_SHAPE(4), (double[]){0, 25, 24, prod100});
        td_tensor_release(r);
        TD_CHECK_OK(td_tensor_sub(a, b, &r));
        double neg3 = dt == TD_UINT8 ? 253 : -3;
        check_values(r, dt, TD_SHAPE(4), (double[]){neg3, 0, 10, 93});
        td_tensor_release(r);
        td_tensor_release(a);
        td_tensor_release(b);

        /* max + 1 is min, for the signed types (uint8: 255 + 1 is 0). */
        td_tensor *m, *one;
        TD_CHECK_OK(td_tensor_zeros(dt, TD_SHAPE(1), &m));
        int64_t max = dt == TD_UINT8 ? 255 : (int64_t)(((uint64_t)1 << (bits - 1)) - 1);
        int64_t zero = 0;
        TD_CHECK_OK(td_tensor_set_i64(m, &zero, max));
        TD_CHECK_OK(td_tensor_ones(dt, TD_SHAPE(1), &one));
        TD_CHECK_OK(td_tensor_add(m, one, &r));
        TD_CHECK_EQ(int_at(r, 0), dt == TD_UINT8 ? 0 : -max - 1);
        td_tensor_release(r);
        td_tensor_release(m);
        td_tensor_release(one);
    }
}

/* The float16 / bfloat16 / float32 result of a op b is the reference rounding of the exact
 * double result, for random operands of every class (NaN, inf, subnormals). */
TD_TEST(reduced_float_results_are_correctly_rounded)
{
    static const td_dtype fdts[] = {TD_FLOAT16, TD_BFLOAT16, TD_FLOAT32};
    static const binary_fn fns[] = {td_tensor_add, td_tensor_sub, td_tensor_mul, td_tensor_div};
    enum { N = 512 };
    for (size_t d = 0; d < 3; d++) {
        td_dtype dt = fdts[d];
        size_t es = td_dtype_size(dt);
        char ra[N * 8], rb[N * 8];
        fill_random(dt, ra, N, 17 + d);
        fill_random(dt, rb, N, 91 + d);
        td_tensor *a, *b;
        TD_CHECK_OK(td_tensor_from_buffer(dt, TD_SHAPE(N), ra, &a));
        TD_CHECK_OK(td_tensor_from_buffer(dt, TD_SHAPE(N), rb, &b));
        for (int f = 0; f < 4; f++) {
            td_tensor *r;
            TD_CHECK_OK(fns[f](a, b, &r));
            TD_CHECK_EQ(td_tensor_dtype(r), dt);
            const char *got = td_tensor_data(r);
            for (int i = 0; i < N; i++) {
                double x = load_real(dt, ra + i * es), y = load_real(dt, rb + i * es);
                double exact = f == 0 ? x + y : f == 1 ? x - y : f == 2 ? x * y : x / y;
                char want[16];
                if (dt == TD_FLOAT32) {
                    float v = (float)exact;
                    memcpy(want, &v, 4);
                } else {
                    store_real(dt, want, exact);
                }
                double w = load_real(dt, want), g = load_real(dt, got + i * es);
                TD_CHECK_MSG((isnan(w) && isnan(g)) || memcmp(want, got + i * es, es) == 0,
                             "%s op %d: %.9g, %.9g gives %.9g, want %.9g", td_dtype_name(dt), f, x, y, g, w);
            }
            td_tensor_release(r);
        }
        td_tensor_release(a);
        td_tensor_release(b);
    }
}

TD_TEST(true_division_gives_float32_for_integers)
{
    td_tensor *a = tensor_of(TD_INT64, TD_SHAPE(4), (double[]){7, 1, -1, 0});
    td_tensor *b = tensor_of(TD_INT32, TD_SHAPE(4), (double[]){2, 0, 0, 0});
    td_tensor *r;
    TD_CHECK_OK(td_tensor_div(a, b, &r));
    check_values(r, TD_FLOAT32, TD_SHAPE(4), (double[]){3.5, INFINITY, -INFINITY, NAN});
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_div_scalar(a, td_scalar_int(4), &r));
    check_values(r, TD_FLOAT32, TD_SHAPE(4), (double[]){1.75, 0.25, -0.25, 0});
    td_tensor_release(r);
    td_tensor *bt = tensor_of(TD_BOOL, TD_SHAPE(2), (double[]){1, 0});
    TD_CHECK_OK(td_tensor_div_scalar(bt, td_scalar_bool(true), &r));
    check_values(r, TD_FLOAT32, TD_SHAPE(2), (double[]){1, 0});
    td_tensor_release(r);
    td_tensor_release(bt);
    td_tensor *d = tensor_of(TD_FLOAT64, TD_SHAPE(1), (double[]){1});
    TD_CHECK_OK(td_tensor_div_scalar(d, td_scalar_int(3), &r));
    check_values(r, TD_FLOAT64, TD_SHAPE(1), (double[]){1.0 / 3});
    td_tensor_release(r);
    td_tensor_release(d);
    td_tensor_release(a);
    td_tensor_release(b);
}

TD_TEST(complex_arithmetic)
{
    static const td_dtype cdts[] = {TD_COMPLEX64, TD_COMPLEX128};
    for (int d = 0; d < 2; d++) {
        td_tensor *a, *b, *r;
        TD_CHECK_OK(td_tensor_zeros(cdts[d], TD_SHAPE(1), &a));
        TD_CHECK_OK(td_tensor_zeros(cdts[d], TD_SHAPE(1), &b));
        int64_t zero = 0;
        TD_CHECK_OK(td_tensor_set_complex(a, &zero, 1, 2));
        TD_CHECK_OK(td_tensor_set_complex(b, &zero, 3, 4));
        double re, im;
        TD_CHECK_OK(td_tensor_mul(a, b, &r));
        complex_at(r, 0, &re, &im);
        TD_CHECK(re == -5 && im == 10);
        td_tensor_release(r);
        TD_CHECK_OK(td_tensor_div(a, b, &r));
        complex_at(r, 0, &re, &im);
        TD_CHECK_NEAR(re, 0.44, 1e-7);
        TD_CHECK_NEAR(im, 0.08, 1e-7);
        td_tensor_release(r);
        TD_CHECK_OK(td_tensor_sub(a, b, &r));
        complex_at(r, 0, &re, &im);
        TD_CHECK(re == -2 && im == -2);
        td_tensor_release(r);
        TD_CHECK_OK(td_tensor_neg(a, &r));
        complex_at(r, 0, &re, &im);
        TD_CHECK(re == -1 && im == -2);
        TD_CHECK_EQ(td_tensor_dtype(r), cdts[d]);
        td_tensor_release(r);
        /* Real operands promote into complex. */
        td_tensor *f = tensor_of(TD_FLOAT32, TD_SHAPE(1), (double[]){0.5});
        TD_CHECK_OK(td_tensor_add(f, a, &r));
        TD_CHECK_EQ(td_tensor_dtype(r), cdts[d]);
        complex_at(r, 0, &re, &im);
        TD_CHECK(re == 1.5 && im == 2);
        td_tensor_release(r);
        td_tensor_release(f);
        td_tensor_release(a);
        td_tensor_release(b);
    }
}

TD_TEST(bool_subtraction_and_negation_fail_as_torch)
{
    td_tensor *b = tensor_of(TD_BOOL, TD_SHAPE(2), (double[]){0, 1});
    td_tensor *i = tensor_of(TD_INT32, TD_SHAPE(2), (double[]){0, 1});
    td_tensor *r;
    TD_CHECK_ERR(td_tensor_sub(b, b, &r), TD_ERR_INVALID,
                 "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or "
                 "`logical_xor()` operator instead.");
    TD_CHECK_ERR(td_tensor_sub(i, b, &r), TD_ERR_INVALID,
                 "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a "
                 "mask, use the `~` or `logical_not()` operator instead.");
    TD_CHECK_ERR(td_tensor_sub_scalar(i, td_scalar_bool(true), &r), TD_ERR_INVALID, "with a bool tensor");
    TD_CHECK_ERR(td_tensor_neg(b, &r), TD_ERR_INVALID,
                 "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a "
                 "tensor, use the `~` or `logical_not()` operator instead.");
    /* add and mul of bools are fine: or and and. */
    TD_CHECK_OK(td_tensor_add(b, b, &r));
    check_values(r, TD_BOOL, TD_SHAPE(2), (double[]){0, 1});
    td_tensor_release(r);
    td_tensor_release(b);
    td_tensor_release(i);
}

/* ---- views ----------------------------------------------------------------------------------- */

/* Each op on views equals the op on contiguous copies of them. */
TD_TEST(non_contiguous_inputs)
{
    td_tensor *base, *baseb;
    TD_CHECK_OK(td_tensor_arange(TD_FLOAT32, 1, 25, 1, &base));
    TD_CHECK_OK(td_tensor_arange(TD_INT16, -12, 12, 1, &baseb));
    td_tensor *m, *mt, *mb, *nar, *col, *ex;
    TD_CHECK_OK(td_tensor_view(base, TD_SHAPE(4, 6), &m));
    TD_CHECK_OK(td_tensor_transpose(m, 0, 1, &mt)); /* [6, 4], strides (1, 6) */
    TD_CHECK_OK(td_tensor_view(baseb, TD_SHAPE(6, 4), &mb));
    TD_CHECK_OK(td_tensor_narrow(mb, 0, 1, 3, &nar)); /* [3, 4] at an offset */
    TD_CHECK_OK(td_tensor_select(m, 1, 2, &col));     /* [4], stride 6 */
    TD_CHECK_OK(td_tensor_expand(col, TD_SHAPE(3, 4), &ex)); /* stride 0 rows */
    struct {
        td_tensor *a, *b;
    } pairs[] = {{mt, mb}, {nar, ex}, {ex, col}, {mt, col}};
    static const binary_fn fns[] = {td_tensor_add, td_tensor_sub, td_tensor_mul, td_tensor_div, td_tensor_eq};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        td_tensor *ca, *cb;
        TD_CHECK_OK(td_tensor_clone(pairs[p].a, &ca));
        TD_CHECK_OK(td_tensor_clone(pairs[p].b, &cb));
        for (size_t f = 0; f < sizeof fns / sizeof fns[0]; f++) {
            td_tensor *r1, *r2;
            TD_CHECK_OK(fns[f](pairs[p].a, pairs[p].b, &r1));
            TD_CHECK_OK(fns[f](ca, cb, &r2));
            TD_CHECK_MSG(td_tensor_equal(r1, r2), "pair %zu op %zu differs on views", p, f);
            td_tensor_release(r1);
            td_tensor_release(r2);
        }
        td_tensor_release(ca);
        td_tensor_release(cb);
    }
    /* Spot values: mt[i][j] = m[j][i] = 1 + j * 6 + i, col[j] = 3 + 6j. */
    td_tensor *r;
    TD_CHECK_OK(td_tensor_add(mt, col, &r));
    TD_CHECK_EQ(value_at(r, 0), 1 + 3);
    TD_CHECK_EQ(value_at(r, 5 * 4 + 3), (1 + 18 + 5) + (3 + 18));
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_neg(mt, &r));
    TD_CHECK_EQ(value_at(r, 1), -7);
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_sum(nar, &r)); /* rows 1..3 of -12..11: -8..3 */
    TD_CHECK_EQ(td_tensor_dtype(r), TD_INT64);
    TD_CHECK_EQ(int_at(r, 0), -30);
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_sum(ex, &r)); /* 3 x (3 + 9 + 15 + 21) */
    TD_CHECK_EQ(value_at(r, 0), 144);
    td_tensor_release(r);
    td_tensor *tbl[] = {base, baseb, m, mt, mb, nar, col, ex};
    for (size_t i = 0; i < sizeof tbl / sizeof tbl[0]; i++)
        td_tensor_release(tbl[i]);
}

/* ---- neg and sum ----------------------------------------------------------------------------- */

TD_TEST(neg_in_each_dtype)
{
    for (int d = TD_UINT8; d <= TD_FLOAT64; d++) {
        td_dtype dt = (td_dtype)d;
        td_tensor *a = tensor_of(dt, TD_SHAPE(3), (double[]){1, 0, 2});
        td_tensor *r;
        TD_CHECK_OK(td_tensor_neg(a, &r));
        if (dt == TD_UINT8)
            check_values(r, dt, TD_SHAPE(3), (double[]){255, 0, 254});
        else if (td_dtype_is_floating(dt))
            check_values(r, dt, TD_SHAPE(3), (double[]){-1, -0.0, -2});
        else
            check_values(r, dt, TD_SHAPE(3), (double[]){-1, 0, -2});
        td_tensor_release(r);
        td_tensor_release(a);
    }
}

TD_TEST(sum_of_every_element)
{
    td_tensor *r;
    /* Integers and bool sum to int64, beyond their own range. */
    td_tensor *i8 = tensor_of(TD_INT8, TD_SHAPE(2, 2), (double[]){100, 100, 100, -1});
    TD_CHECK_OK(td_tensor_sum(i8, &r));
    TD_CHECK_EQ(td_tensor_ndim(r), 0);
    TD_CHECK_EQ(td_tensor_dtype(r), TD_INT64);
    TD_CHECK_EQ(int_at(r, 0), 299);
    td_tensor_release(r);
    td_tensor_release(i8);
    td_tensor *b = tensor_of(TD_BOOL, TD_SHAPE(4), (double[]){1, 0, 1, 1});
    TD_CHECK_OK(td_tensor_sum(b, &r));
    TD_CHECK_EQ(td_tensor_dtype(r), TD_INT64);
    TD_CHECK_EQ(int_at(r, 0), 3);
    td_tensor_release(r);
    td_tensor_release(b);
    /* Floats keep their dtype; float16 rounds once at the end (2048 + 8 x 0.5 = 2052). */
    td_tensor *h = tensor_of(TD_FLOAT16, TD_SHAPE(9), (double[]){2048, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5});
    TD_CHECK_OK(td_tensor_sum(h, &r));
    check_values(r, TD_FLOAT16, TD_SHAPE_SCALAR, (double[]){2052});
    td_tensor_release(r);
    td_tensor_release(h);
    td_tensor *c;
    TD_CHECK_OK(td_tensor_full(TD_COMPLEX64, TD_SHAPE(3), 2, &c));
    TD_CHECK_OK(td_tensor_sum(c, &r));
    double re, im;
    complex_at(r, 0, &re, &im);
    TD_CHECK(re == 6 && im == 0 && td_tensor_dtype(r) == TD_COMPLEX64);
    td_tensor_release(r);
    td_tensor_release(c);
    /* Empty and 0-dim. */
    td_tensor *e;
    TD_CHECK_OK(td_tensor_empty(TD_FLOAT32, TD_SHAPE(0, 3), &e));
    TD_CHECK_OK(td_tensor_sum(e, &r));
    check_values(r, TD_FLOAT32, TD_SHAPE_SCALAR, (double[]){0});
    td_tensor_release(r);
    td_tensor_release(e);
    td_tensor *s = tensor_of(TD_FLOAT64, TD_SHAPE_SCALAR, (double[]){-2.5});
    TD_CHECK_OK(td_tensor_sum(s, &r));
    check_values(r, TD_FLOAT64, TD_SHAPE_SCALAR, (double[]){-2.5});
    td_tensor_release(r);
    td_tensor_release(s);
}

/* ---- matmul ---------------------------------------------------------------------------------- */

/* Reference product of row-major double matrices. */
static void ref_mm(const double *a, const double *b, double *c, int n, int k, int m)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double s = 0;
            for (int p = 0; p < k; p++)
                s += a[i * k + p] * b[p * m + j];
            c[i * m + j] = s;
        }
}

TD_TEST(matmul_in_each_dtype)
{
    static const td_dtype dts[] = {TD_UINT8, TD_INT8, TD_INT16, TD_INT32, TD_INT64, TD_FLOAT16,
                                   TD_BFLOAT16, TD_FLOAT32, TD_FLOAT64, TD_COMPLEX64, TD_COMPLEX128};
    double av[6] = {1, 2, 3, 4, 5, 6}, bv[6] = {7, 8, 9, 10, 11, 12}, want[9];
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        td_dtype dt = dts[d];
        td_tensor *a = tensor_of(dt, TD_SHAPE(2, 3), av), *b = tensor_of(dt, TD_SHAPE(3, 2), bv), *r;
        /* mm [2x3] @ [3x2] */
        ref_mm(av, bv, want, 2, 3, 2);
        if (dt == TD_UINT8 || dt == TD_INT8) /* 58 64 139 154 wrap in 8 bits */
            for (int i = 0; i < 4; i++)
                want[i] = dt == TD_UINT8 ? (uint8_t)(int)want[i] : (int8_t)(int)want[i];
        TD_CHECK_OK(td_tensor_matmul(a, b, &r));
        if (td_dtype_is_complex(dt)) {
            TD_CHECK_EQ(td_tensor_dtype(r), dt);
            double re, im;
            complex_at(r, 3, &re, &im);
            TD_CHECK(re == 154 && im == 0);
        } else {
            check_values(r, dt, TD_SHAPE(2, 2), want);
        }
        td_tensor_release(r);
        /* mm of the transposes: [2x3]^T @ [3x2]^T = [3x3] */
        td_tensor *at, *bt;
        TD_CHECK_OK(td_tensor_transpose(a, 0, 1, &at));
        TD_CHECK_OK(td_tensor_transpose(b, 0, 1, &bt));
        TD_CHECK_OK(td_tensor_mm(at, bt, &r));
        double atv[6] = {1, 4, 2, 5, 3, 6}, btv[6] = {7, 9, 11, 8, 10, 12};
        ref_mm(atv, btv, want, 3, 2, 3);
        if (dt != TD_UINT8 && dt != TD_INT8 && !td_dtype_is_complex(dt))
            check_values(r, dt, TD_SHAPE(3, 3), want);
        TD_CHECK_EQ(td_tensor_numel(r), 9);
        td_tensor_release(r);
        td_tensor_release(at);
        td_tensor_release(bt);
        td_tensor_release(a);
        td_tensor_release(b);
    }
}

/* The real dtypes' tiled kernel (4 x 8 register tiles over packed panels, AVX2 where the CPU has
 * it) against the plain i-j-p loop, bit for bit: shapes that leave partial tiles in every
 * direction, transposed operands, float32 and float64. */
TD_TEST(matmul_tiles_match_plain_loop_exactly)
{
    static const int sizes[] = {1, 3, 4, 5, 8, 9, 17, 33};
    const int ns = (int)(sizeof sizes / sizeof sizes[0]);
    uint32_t seed = 12345;
    for (int d = 0; d < 2; d++) {
        td_dtype dt = d ? TD_FLOAT64 : TD_FLOAT32;
        for (int x = 0; x < ns; x++)
            for (int y = 0; y < ns; y++)
                for (int z = 0; z < ns; z++) {
                    int n = sizes[x], k = sizes[y], m = sizes[z];
                    double *av = malloc(sizeof(double) * (size_t)(n * k)), *bv = malloc(sizeof(double) * (size_t)(k * m));
                    double *want = malloc(sizeof(double) * (size_t)(n * m));
                    TD_CHECK(av && bv && want);
                    for (int i = 0; i < n * k + k * m; i++) {
                        seed = seed * 1103515245u + 12345u;
                        double v = ((double)(seed >> 8) / (1 << 24) - 0.5) * 3.7;
                        if (!d)
                            v = (float)v;
                        if (i < n * k)
                            av[i] = v;
                        else
                            bv[i - n * k] = v;
                    }
                    ref_mm(av, bv, want, n, k, m);
                    if (!d)
                        for (int i = 0; i < n * m; i++)
                            want[i] = (float)want[i];
                    td_tensor *a = tensor_of(dt, TD_SHAPE(n, k), av), *b = tensor_of(dt, TD_SHAPE(k, m), bv), *r;
                    TD_CHECK_OK(td_tensor_mm(a, b, &r));
                    check_values(r, dt, TD_SHAPE(n, m), want);
                    td_tensor_release(r);
                    /* The same product from transposed storage: (a^T)^T @ (b^T)^T. */
                    td_tensor *at, *bt, *att, *btt;
                    TD_CHECK_OK(td_tensor_transpose(a, 0, 1, &at));
                    TD_CHECK_OK(td_tensor_contiguous(at, &att));
                    TD_CHECK_OK(td_tensor_transpose(b, 0, 1, &bt));
                    TD_CHECK_OK(td_tensor_contiguous(bt, &btt));
                    td_tensor_release(at);
                    td_tensor_release(bt);
                    TD_CHECK_OK(td_tensor_transpose(att, 0, 1, &at));
                    TD_CHECK_OK(td_tensor_transpose(btt, 0, 1, &bt));
                    TD_CHECK_OK(td_tensor_mm(at, bt, &r));
                    check_values(r, dt, TD_SHAPE(n, m), want);
                    td_tensor_release(r);
                    td_tensor_release(at);
                    td_tensor_release(bt);
                    td_tensor_release(att);
                    td_tensor_release(btt);
                    td_tensor_release(a);
                    td_tensor_release(b);
                    free(av);
                    free(bv);
                    free(want);
                }
    }
}

TD_TEST(matmul_vector_forms)
{
    td_tensor *m = tensor_of(TD_FLOAT64, TD_SHAPE(2, 3), (double[]){1, 2, 3, 4, 5, 6});
    td_tensor *v3 = tensor_of(TD_FLOAT64, TD_SHAPE(3), (double[]){1, 0, -1});
    td_tensor *v2 = tensor_of(TD_FLOAT64, TD_SHAPE(2), (double[]){2, 1});
    td_tensor *r;
    TD_CHECK_OK(td_tensor_matmul(m, v3, &r)); /* mv */
    check_values(r, TD_FLOAT64, TD_SHAPE(2), (double[]){-2, -2});
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_mv(m, v3, &r));
    check_values(r, TD_FLOAT64, TD_SHAPE(2), (double[]){-2, -2});
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_matmul(v2, m, &r)); /* vector @ matrix */
    check_values(r, TD_FLOAT64, TD_SHAPE(3), (double[]){6, 9, 12});
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_matmul(v3, v3, &r)); /* dot */
    check_values(r, TD_FLOAT64, TD_SHAPE_SCALAR, (double[]){2});
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_dot(v2, v2, &r));
    check_values(r, TD_FLOAT64, TD_SHAPE_SCALAR, (double[]){5});
    td_tensor_release(r);
    /* A strided vector: column 1 of m is (2, 5). */
    td_tensor *col;
    TD_CHECK_OK(td_tensor_select(m, 1, 1, &col));
    TD_CHECK_OK(td_tensor_dot(col, v2, &r));
    check_values(r, TD_FLOAT64, TD_SHAPE_SCALAR, (double[]){9});
    td_tensor_release(r);
    td_tensor_release(col);
    /* Empty inner dim: zeros. */
    td_tensor *e1, *e2;
    TD_CHECK_OK(td_tensor_empty(TD_FLOAT32, TD_SHAPE(2, 0), &e1));
    TD_CHECK_OK(td_tensor_empty(TD_FLOAT32, TD_SHAPE(0, 3), &e2));
    TD_CHECK_OK(td_tensor_mm(e1, e2, &r));
    check_values(r, TD_FLOAT32, TD_SHAPE(2, 3), (double[]){0, 0, 0, 0, 0, 0});
    td_tensor_release(r);
    td_tensor_release(e1);
    td_tensor_release(e2);
    td_tensor_release(m);
    td_tensor_release(v3);
    td_tensor_release(v2);
}

TD_TEST(matmul_errors_carry_torch_messages)
{
    td_tensor *a, *b, *v4, *v3, *s, *m3, *d, *r = NULL;
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(2, 3), &a));
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(4, 5), &b));
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(4), &v4));
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(3), &v3));
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE_SCALAR, &s));
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(2, 3, 4), &m3));
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT64, TD_SHAPE(3, 2), &d));
    TD_CHECK_ERR(td_tensor_matmul(a, b, &r), TD_ERR_INVALID, "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)");
    TD_CHECK_ERR(td_tensor_mm(a, b, &r), TD_ERR_INVALID, "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)");
    TD_CHECK_ERR(td_tensor_matmul(v3, b, &r), TD_ERR_INVALID, "mat1 and mat2 shapes cannot be multiplied (1x3 and 4x5)");
    TD_CHECK_ERR(td_tensor_matmul(a, v4, &r), TD_ERR_INVALID, "size mismatch, got input (2), mat (2x3), vec (4)");
    TD_CHECK_ERR(td_tensor_matmul(v3, v4, &r), TD_ERR_INVALID,
                 "inconsistent tensor size, expected tensor [3] and src [4] to have the same number of elements, but "
                 "got 3 and 4 elements respectively");
    TD_CHECK_ERR(td_tensor_matmul(s, v3, &r), TD_ERR_INVALID,
                 "both arguments to matmul need to be at least 1D, but they are 0D and 1D");
    TD_CHECK_ERR(td_tensor_matmul(m3, b, &r), TD_ERR_UNSUPPORTED, "3D and 2D");
    TD_CHECK_ERR(td_tensor_matmul(a, d, &r), TD_ERR_INVALID, "expected m1 and m2 to have the same dtype");
    TD_CHECK_ERR(td_tensor_mm(v3, b, &r), TD_ERR_INVALID, "self must be a matrix");
    TD_CHECK_ERR(td_tensor_mm(a, v3, &r), TD_ERR_INVALID, "mat2 must be a matrix");
    TD_CHECK_ERR(td_tensor_dot(a, v3, &r), TD_ERR_INVALID, "1D tensors expected, but got 2D and 1D tensors");
    TD_CHECK(r == NULL);
    td_tensor *tbl[] = {a, b, v4, v3, s, m3, d};
    for (size_t i = 0; i < sizeof tbl / sizeof tbl[0]; i++)
        td_tensor_release(tbl[i]);
}

/* ---- nonzero and eq -------------------------------------------------------------------------- */

TD_TEST(nonzero_lists_indices_in_row_major_order)
{
    td_tensor *a = tensor_of(TD_FLOAT32, TD_SHAPE(2, 3), (double[]){0, 1.5, 0, NAN, 0, -2});
    td_tensor *r;
    TD_CHECK_OK(td_tensor_nonzero(a, &r));
    check_values(r, TD_INT64, TD_SHAPE(3, 2), (double[]){0, 1, 1, 0, 1, 2});
    td_tensor_release(r);
    /* On the transpose [3, 2]: (1,0), (0,1), (2,1). */
    td_tensor *at;
    TD_CHECK_OK(td_tensor_transpose(a, 0, 1, &at));
    TD_CHECK_OK(td_tensor_nonzero(at, &r));
    check_values(r, TD_INT64, TD_SHAPE(3, 2), (double[]){0, 1, 1, 0, 2, 1});
    td_tensor_release(r);
    td_tensor_release(at);
    td_tensor_release(a);
    /* Complex with only an imaginary part counts. */
    td_tensor *c;
    TD_CHECK_OK(td_tensor_zeros(TD_COMPLEX128, TD_SHAPE(3), &c));
    int64_t two = 2;
    TD_CHECK_OK(td_tensor_set_complex(c, &two, 0, 1));
    TD_CHECK_OK(td_tensor_nonzero(c, &r));
    check_values(r, TD_INT64, TD_SHAPE(1, 1), (double[]){2});
    td_tensor_release(r);
    td_tensor_release(c);
    /* 0-dim: [1, 0] or [0, 0]; all zero: [0, ndim]. */
    td_tensor *s = tensor_of(TD_INT32, TD_SHAPE_SCALAR, (double[]){5});
    TD_CHECK_OK(td_tensor_nonzero(s, &r));
    TD_CHECK(td_tensor_ndim(r) == 2 && td_tensor_sizes(r)[0] == 1 && td_tensor_sizes(r)[1] == 0);
    td_tensor_release(r);
    td_tensor_release(s);
    td_tensor *z;
    TD_CHECK_OK(td_tensor_zeros(TD_BOOL, TD_SHAPE(2, 2, 2), &z));
    TD_CHECK_OK(td_tensor_nonzero(z, &r));
    TD_CHECK(td_tensor_dtype(r) == TD_INT64 && td_tensor_sizes(r)[0] == 0 && td_tensor_sizes(r)[1] == 3);
    td_tensor_release(r);
    td_tensor_release(z);
}

TD_TEST(eq_compares_in_the_promoted_dtype)
{
    td_tensor *a = tensor_of(TD_INT32, TD_SHAPE(2, 2), (double[]){1, 2, 3, 4});
    td_tensor *b = tensor_of(TD_FLOAT64, TD_SHAPE(2), (double[]){1, 4});
    td_tensor *r;
    TD_CHECK_OK(td_tensor_eq(a, b, &r));
    check_values(r, TD_BOOL, TD_SHAPE(2, 2), (double[]){1, 0, 0, 1});
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_eq_scalar(a, td_scalar_float(3.0), &r));
    check_values(r, TD_BOOL, TD_SHAPE(2, 2), (double[]){0, 0, 1, 0});
    td_tensor_release(r);
    td_tensor *n = tensor_of(TD_FLOAT32, TD_SHAPE(1), (double[]){NAN});
    TD_CHECK_OK(td_tensor_eq(n, n, &r));
    check_values(r, TD_BOOL, TD_SHAPE(1), (double[]){0});
    td_tensor_release(r);
    td_tensor_release(n);
    td_tensor_release(a);
    td_tensor_release(b);
}

TD_TEST_MAIN()
