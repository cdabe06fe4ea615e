/* Printing: td_tensor_format against torch 1.13's repr of the same tensors (captured with
 * /usr/bin/python3 and torch; the only difference is that dtypes print without "torch."): integer
 * widths, float fixed / integer / scientific modes, NaN and infinities, bool, 16-bit floats,
 * complex, 0-dim and empty tensors, line wrapping, nesting and summarization past 1000 elements. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/testing.h>

#include "tensor_util.h"

static td_tensor *from(td_dtype dt, td_shape shape, const double *values) { return tensor_of(dt, shape, values); }

static void expect(td_tensor *t, const char *want)
{
    check_format(t, want);
    td_tensor_release(t);
}

TD_TEST(format_matches_torch)
{
    td_tensor *t;
    expect(from(TD_INT64, TD_SHAPE(3), (double[]){1, 2, 3}), "tensor([1, 2, 3])");
    expect(from(TD_INT64, TD_SHAPE(2), (double[]){1, 100}), "tensor([  1, 100])");
    expect(from(TD_FLOAT32, TD_SHAPE(2), (double[]){1, 2.5}), "tensor([1.0000, 2.5000])");
    expect(from(TD_FLOAT32, TD_SHAPE(2), (double[]){1, 2}), "tensor([1., 2.])");
    expect(from(TD_FLOAT64, TD_SHAPE(2, 2), (double[]){1, 2, 3, 4}), "tensor([[1., 2.],\n"
               "        [3., 4.]], dtype=float64)");
    expect(from(TD_FLOAT32, TD_SHAPE(3), (double[]){0, 1e5, 1e-5}), "tensor([0.0000e+00, 1.0000e+05, 1.0000e-05])");
    expect(from(TD_FLOAT32, TD_SHAPE(3), (double[]){NAN, INFINITY, -INFINITY}), "tensor([nan, inf, -inf])");
    expect(from(TD_FLOAT32, TD_SHAPE(3), (double[]){1.5, NAN, -INFINITY}), "tensor([1.5000,    nan,   -inf])");
    expect(from(TD_FLOAT32, TD_SHAPE(3), (double[]){1, NAN, -INFINITY}), "tensor([1., nan, -inf])");
    expect(from(TD_FLOAT32, TD_SHAPE(2), (double[]){1e9, 1}), "tensor([1.0000e+09, 1.0000e+00])");
    expect(from(TD_FLOAT32, TD_SHAPE(2), (double[]){-0.0, 0}), "tensor([-0., 0.])");
    expect(from(TD_BOOL, TD_SHAPE(2), (double[]){1, 0}), "tensor([ True, False])");
    expect(from(TD_INT32, TD_SHAPE(2), (double[]){-5, 7}), "tensor([-5,  7], dtype=int32)");
    expect(from(TD_FLOAT16, TD_SHAPE(2), (double[]){0.1, 2}), "tensor([0.1000, 2.0000], dtype=float16)");
    expect(from(TD_BFLOAT16, TD_SHAPE(2), (double[]){0.1, 2}), "tensor([0.1001, 2.0000], dtype=bfloat16)");
    expect(from(TD_UINT8, TD_SHAPE_SCALAR, (double[]){7}), "tensor(7, dtype=uint8)");
    expect(from(TD_FLOAT32, TD_SHAPE_SCALAR, (double[]){1.5}), "tensor(1.5000)");
    expect(from(TD_FLOAT32, TD_SHAPE_SCALAR, (double[]){3}), "tensor(3.)");
    td_tensor_zeros(TD_FLOAT32, TD_SHAPE(0), &t); expect(t, "tensor([])");
    td_tensor_zeros(TD_INT64, TD_SHAPE(0), &t); expect(t, "tensor([], dtype=int64)");
    td_tensor_zeros(TD_FLOAT64, TD_SHAPE(0, 3), &t); expect(t, "tensor([], size=(0, 3), dtype=float64)");
    td_tensor_arange(TD_INT64, 0, 2000, 1, &t); expect(t, "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
    td_tensor_arange(TD_FLOAT32, 0, 30, 1, &t); expect(t, "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n"
               "        14., 15., 16., 17., 18., 19., 20., 21., 22., 23., 24., 25., 26., 27.,\n"
               "        28., 29.])");
    td_tensor_arange(TD_FLOAT32, 0, 30, 0.5, &t); expect(t, "tensor([ 0.0000,  0.5000,  1.0000,  1.5000,  2.0000,  2.5000,  3.0000,  3.5000,\n"
               "         4.0000,  4.5000,  5.0000,  5.5000,  6.0000,  6.5000,  7.0000,  7.5000,\n"
               "         8.0000,  8.5000,  9.0000,  9.5000, 10.0000, 10.5000, 11.0000, 11.5000,\n"
               "        12.0000, 12.5000, 13.0000, 13.5000, 14.0000, 14.5000, 15.0000, 15.5000,\n"
               "        16.0000, 16.5000, 17.0000, 17.5000, 18.0000, 18.5000, 19.0000, 19.5000,\n"
               "        20.0000, 20.5000, 21.0000, 21.5000, 22.0000, 22.5000, 23.0000, 23.5000,\n"
               "        24.0000, 24.5000, 25.0000, 25.5000, 26.0000, 26.5000, 27.0000, 27.5000,\n"
               "        28.0000, 28.5000, 29.0000, 29.5000])");
    { td_tensor *a; td_tensor_arange(TD_FLOAT64, 0, 2400, 1, &a); td_tensor_view(a, TD_SHAPE(20, 10, 12), &t); td_tensor_release(a); expect(t, "tensor([[[0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 9.0000e+00,\n"
               "          1.0000e+01, 1.1000e+01],\n"
               "         [1.2000e+01, 1.3000e+01, 1.4000e+01,  ..., 2.1000e+01,\n"
               "          2.2000e+01, 2.3000e+01],\n"
               "         [2.4000e+01, 2.5000e+01, 2.6000e+01,  ..., 3.3000e+01,\n"
               "          3.4000e+01, 3.5000e+01],\n"
               "         ...,\n"
               "         [8.4000e+01, 8.5000e+01, 8.6000e+01,  ..., 9.3000e+01,\n"
               "          9.4000e+01, 9.5000e+01],\n"
               "         [9.6000e+01, 9.7000e+01, 9.8000e+01,  ..., 1.0500e+02,\n"
               "          1.0600e+02, 1.0700e+02],\n"
               "         [1.0800e+02, 1.0900e+02, 1.1000e+02,  ..., 1.1700e+02,\n"
               "          1.1800e+02, 1.1900e+02]],\n"
               "\n"
               "        [[1.2000e+02, 1.2100e+02, 1.2200e+02,  ..., 1.2900e+02,\n"
               "          1.3000e+02, 1.3100e+02],\n"
               "         [1.3200e+02, 1.3300e+02, 1.3400e+02,  ..., 1.4100e+02,\n"
               "          1.4200e+02, 1.4300e+02],\n"
               "         [1.4400e+02, 1.4500e+02, 1.4600e+02,  ..., 1.5300e+02,\n"
               "          1.5400e+02, 1.5500e+02],\n"
               "         ...,\n"
               "         [2.0400e+02, 2.0500e+02, 2.0600e+02,  ..., 2.1300e+02,\n"
               "          2.1400e+02, 2.1500e+02],\n"
               "         [2.1600e+02, 2.1700e+02, 2.1800e+02,  ..., 2.2500e+02,\n"
               "          2.2600e+02, 2.2700e+02],\n"
               "         [2.2800e+02, 2.2900e+02, 2.3000e+02,  ..., 2.3700e+02,\n"
               "          2.3800e+02, 2.3900e+02]],\n"
               "\n"
               "        [[2.4000e+02, 2.4100e+02, 2.4200e+02,  ..., 2.4900e+02,\n"
               "          2.5000e+02, 2.5100e+02],\n"
               "         [2.5200e+02, 2.5300e+02, 2.5400e+02,  ..., 2.6100e+02,\n"
               "          2.6200e+02, 2.6300e+02],\n"
               "         [2.6400e+02, 2.6500e+02, 2.6600e+02,  ..., 2.7300e+02,\n"
               "          2.7400e+02, 2.7500e+02],\n"
               "         ...,\n"
               "         [3.2400e+02, 3.2500e+02, 3.2600e+02,  ..., 3.3300e+02,\n"
               "          3.3400e+02, 3.3500e+02],\n"
               "         [3.3600e+02, 3.3700e+02, 3.3800e+02,  ..., 3.4500e+02,\n"
               "          3.4600e+02, 3.4700e+02],\n"
               "         [3.4800e+02, 3.4900e+02, 3.5000e+02,  ..., 3.5700e+02,\n"
               "          3.5800e+02, 3.5900e+02]],\n"
               "\n"
               "        ...,\n"
               "\n"
               "        [[2.0400e+03, 2.0410e+03, 2.0420e+03,  ..., 2.0490e+03,\n"
               "          2.0500e+03, 2.0510e+03],\n"
               "         [2.0520e+03, 2.0530e+03, 2.0540e+03,  ..., 2.0610e+03,\n"
               "          2.0620e+03, 2.0630e+03],\n"
               "         [2.0640e+03, 2.0650e+03, 2.0660e+03,  ..., 2.0730e+03,\n"
               "          2.0740e+03, 2.0750e+03],\n"
               "         ...,\n"
               "         [2.1240e+03, 2.1250e+03, 2.1260e+03,  ..., 2.1330e+03,\n"
               "          2.1340e+03, 2.1350e+03],\n"
               "         [2.1360e+03, 2.1370e+03, 2.1380e+03,  ..., 2.1450e+03,\n"
               "          2.1460e+03, 2.1470e+03],\n"
               "         [2.1480e+03, 2.1490e+03, 2.1500e+03,  ..., 2.1570e+03,\n"
               "          2.1580e+03, 2.1590e+03]],\n"
               "\n"
               "        [[2.1600e+03, 2.1610e+03, 2.1620e+03,  ..., 2.1690e+03,\n"
               "          2.1700e+03, 2.1710e+03],\n"
               "         [2.1720e+03, 2.1730e+03, 2.1740e+03,  ..., 2.1810e+03,\n"
               "          2.1820e+03, 2.1830e+03],\n"
               "         [2.1840e+03, 2.1850e+03, 2.1860e+03,  ..., 2.1930e+03,\n"
               "          2.1940e+03, 2.1950e+03],\n"
               "         ...,\n"
               "         [2.2440e+03, 2.2450e+03, 2.2460e+03,  ..., 2.2530e+03,\n"
               "          2.2540e+03, 2.2550e+03],\n"
               "         [2.2560e+03, 2.2570e+03, 2.2580e+03,  ..., 2.2650e+03,\n"
               "          2.2660e+03, 2.2670e+03],\n"
               "         [2.2680e+03, 2.2690e+03, 2.2700e+03,  ..., 2.2770e+03,\n"
               "          2.2780e+03, 2.2790e+03]],\n"
               "\n"
               "        [[2.2800e+03, 2.2810e+03, 2.2820e+03,  ..., 2.2890e+03,\n"
               "          2.2900e+03, 2.2910e+03],\n"
               "         [2.2920e+03, 2.2930e+03, 2.2940e+03,  ..., 2.3010e+03,\n"
               "          2.3020e+03, 2.3030e+03],\n"
               "         [2.3040e+03, 2.3050e+03, 2.3060e+03,  ..., 2.3130e+03,\n"
               "          2.3140e+03, 2.3150e+03],\n"
               "         ...,\n"
               "         [2.3640e+03, 2.3650e+03, 2.3660e+03,  ..., 2.3730e+03,\n"
               "          2.3740e+03, 2.3750e+03],\n"
               "         [2.3760e+03, 2.3770e+03, 2.3780e+03,  ..., 2.3850e+03,\n"
               "          2.3860e+03, 2.3870e+03],\n"
               "         [2.3880e+03, 2.3890e+03, 2.3900e+03,  ..., 2.3970e+03,\n"
               "          2.3980e+03, 2.3990e+03]]], dtype=float64)"); }
    { td_tensor *a; td_tensor_arange(TD_INT64, 0, 24, 1, &a); td_tensor_view(a, TD_SHAPE(2, 3, 4), &t); td_tensor_release(a); expect(t, "tensor([[[ 0,  1,  2,  3],\n"
               "         [ 4,  5,  6,  7],\n"
               "         [ 8,  9, 10, 11]],\n"
               "\n"
               "        [[12, 13, 14, 15],\n"
               "         [16, 17, 18, 19],\n"
               "         [20, 21, 22, 23]]])"); }
    { td_tensor *a; td_tensor_arange(TD_INT32, 0, 24, 1, &a); td_tensor_view(a, TD_SHAPE(2, 3, 4), &t); td_tensor_release(a); expect(t, "tensor([[[ 0,  1,  2,  3],\n"
               "         [ 4,  5,  6,  7],\n"
               "         [ 8,  9, 10, 11]],\n"
               "\n"
               "        [[12, 13, 14, 15],\n"
               "         [16, 17, 18, 19],\n"
               "         [20, 21, 22, 23]]], dtype=int32)"); }
    { td_tensor *a; td_tensor_arange(TD_INT64, 0, 2000, 1, &a); td_tensor_view(a, TD_SHAPE(40, 50), &t); td_tensor_release(a); expect(t, "tensor([[   0,    1,    2,  ...,   47,   48,   49],\n"
               "        [  50,   51,   52,  ...,   97,   98,   99],\n"
               "        [ 100,  101,  102,  ...,  147,  148,  149],\n"
               "        ...,\n"
               "        [1850, 1851, 1852,  ..., 1897, 1898, 1899],\n"
               "        [1900, 1901, 1902,  ..., 1947, 1948, 1949],\n"
               "        [1950, 1951, 1952,  ..., 1997, 1998, 1999]])"); }
    td_tensor_zeros(TD_COMPLEX64, TD_SHAPE(2), &t); { int64_t i = 0; td_tensor_set_complex(t, &i, 1, 2); i = 1; td_tensor_set_complex(t, &i, -1.5, -0.25);} expect(t, "tensor([ 1.0000+2.0000j, -1.5000-0.2500j])");
    td_tensor_zeros(TD_COMPLEX128, TD_SHAPE_SCALAR, &t); td_tensor_set_complex(t, NULL, 1, 2); expect(t, "tensor(1.+2.j, dtype=complex128)");
    td_tensor_zeros(TD_COMPLEX64, TD_SHAPE(2), &t); { int64_t i = 0; td_tensor_set_complex(t, &i, 1, 0); i = 1; td_tensor_set_complex(t, &i, 3, -0.0);} expect(t, "tensor([1.+0.j, 3.-0.j])");
    expect(from(TD_FLOAT32, TD_SHAPE(4), (double[]){123456.789, 0.001, 1, 2}), "tensor([1.2346e+05, 1.0000e-03, 1.0000e+00, 2.0000e+00])");
    expect(from(TD_FLOAT32, TD_SHAPE(3), (double[]){-1.25, 10, 0.5}), "tensor([-1.2500, 10.0000,  0.5000])");
}

TD_TEST(format_of_views_reads_through_strides)
{
    td_tensor *a, *m, *t;
    TD_CHECK_OK(td_tensor_arange(TD_INT32, 0, 6, 1, &a));
    TD_CHECK_OK(td_tensor_view(a, TD_SHAPE(2, 3), &m));
    TD_CHECK_OK(td_tensor_transpose(m, 0, 1, &t));
    check_format(t, "tensor([[0, 3],\n"
                    "        [1, 4],\n"
                    "        [2, 5]], dtype=int32)");
    td_tensor_release(t);
    TD_CHECK_OK(td_tensor_select(m, 1, 2, &t));
    check_format(t, "tensor([2, 5], dtype=int32)");
    td_tensor_release(t);
    td_tensor_release(m);
    td_tensor_release(a);
}

TD_TEST(print_writes_a_line)
{
    td_tensor *t = tensor_of(TD_FLOAT32, TD_SHAPE(2), (double[]){0.5, -1});
    FILE *f = tmpfile();
    TD_CHECK(f != NULL);
    td_tensor_print(f, t);
    rewind(f);
    char line[128] = {0};
    TD_CHECK(fgets(line, sizeof line, f) != NULL);
    TD_CHECK_STR_EQ(line, "tensor([ 0.5000, -1.0000])\n");
    fclose(f);
    td_tensor_release(t);
    char *s = td_tensor_format(NULL);
    TD_CHECK_STR_EQ(s, "NULL");
    free(s);
}

TD_TEST_MAIN()
