/* Ops on device tensors follow their inputs, not the current device (spec/cuda_multigpu.md
 * section 1.1): test_cat_autogpu from test_cuda_multigpu.py, torch.cat (td_tensor_cat) on one
 * device with several inputs, dims, dtype promotion, channels_last and skipped 1-D empty tensors,
 * and its messages, PyTorch's words. td_tensor_cat is one implementation for host and device
 * tensors, so the host cases (plain cases without a device parameter) run here too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/device.h>
#include <tdist/testing.h>

#include "device_util.h"

static const td_device cpu = {TD_DEVICE_CPU, -1};

static void release_n(td_tensor **ts, int n)
{
    for (int i = 0; i < n; i++)
        td_tensor_release(ts[i]);
}

/* t[i][j] of a 2-D tensor anywhere (device tensors are read through a host copy). */
static double at2(const td_tensor *t, int64_t i, int64_t j) { return dev_get(t, i * td_tensor_size(t, 1) + j); }

/* The part of t along dim starting at start equals expected (same dtype and values). */
static void check_slice(td_tensor *t, int dim, int64_t start, const td_tensor *expected)
{
    td_tensor *part = NULL;
    TD_CHECK_OK(td_tensor_narrow(t, dim, start, td_tensor_size(expected, dim), &part));
    TD_CHECK(td_tensor_equal(part, expected));
    td_tensor_release(part);
}

static bool channels_last_contiguous(const td_tensor *t)
{
    const int64_t *s = td_tensor_sizes(t), *st = td_tensor_strides(t);
    return st[1] == 1 && st[3] == s[1] && st[2] == s[1] * s[3] && st[0] == s[1] * s[2] * s[3];
}

/* (n, 3, 4, 4) laid out as NHWC, values 0, mul, 2 mul, ... in NHWC order. */
static td_tensor *nhwc_tensor(int64_t n, double mul)
{
    td_tensor *data = dev_host_arange(TD_FLOAT32, TD_SHAPE(n, 4, 4, 3), mul), *t = NULL;
    const int perm[4] = {0, 3, 1, 2};
    TD_CHECK_OK(td_tensor_permute(data, perm, 4, &t));
    td_tensor_release(data);
    TD_CHECK(channels_last_contiguous(t));
    return t;
}

/* ---- host ----------------------------------------------------------------------------------- */

TD_TEST(test_cat_host)
{
    td_tensor *x = dev_host_arange(TD_FLOAT32, TD_SHAPE(2, 3), 1.0);  /* 0 .. 5 */
    td_tensor *y = dev_host_arange(TD_FLOAT32, TD_SHAPE(1, 3), 10.0); /* 0 10 20 */
    td_tensor *w = dev_host_arange(TD_FLOAT32, TD_SHAPE(2, 2), 100.0);
    const td_tensor *xy[2] = {x, y}, *xw[2] = {x, w};
    for (int dim = 0; dim >= -2; dim -= 2) { /* 0 and -2 */
        td_tensor *z = NULL;
        TD_CHECK_OK(td_tensor_cat(xy, 2, dim, &z));
        TD_CHECK_EQ(td_tensor_size(z, 0), 3);
        TD_CHECK_EQ(td_tensor_size(z, 1), 3);
        TD_CHECK(td_tensor_is_contiguous(z));
        TD_CHECK(td_device_equal(td_tensor_device(z), cpu));
        TD_CHECK_EQ(at2(z, 1, 2), 5);
        TD_CHECK_EQ(at2(z, 2, 1), 10);
        check_slice(z, 0, 0, x);
        check_slice(z, 0, 2, y);
        td_tensor_release(z);
    }
    for (int dim = 1; dim >= -1; dim -= 2) { /* 1 and -1 */
        td_tensor *z = NULL;
        TD_CHECK_OK(td_tensor_cat(xw, 2, dim, &z));
        TD_CHECK_EQ(td_tensor_size(z, 0), 2);
        TD_CHECK_EQ(td_tensor_size(z, 1), 5);
        const double row1[5] = {3, 4, 5, 200, 300};
        for (int j = 0; j < 5; j++)
            TD_CHECK_EQ(at2(z, 1, j), row1[j]);
        check_slice(z, 1, 0, x);
        check_slice(z, 1, 3, w);
        td_tensor_release(z);
    }
    /* three inputs, one a transposed (non-contiguous) view */
    td_tensor *base = dev_host_arange(TD_FLOAT32, TD_SHAPE(3, 2), -1.0), *tr = NULL, *z = NULL;
    TD_CHECK_OK(td_tensor_transpose(base, 0, 1, &tr));
    TD_CHECK(!td_tensor_is_contiguous(tr));
    const td_tensor *three[3] = {x, tr, x};
    TD_CHECK_OK(td_tensor_cat(three, 3, 0, &z));
    TD_CHECK_EQ(td_tensor_size(z, 0), 6);
    check_slice(z, 0, 0, x);
    check_slice(z, 0, 2, tr);
    check_slice(z, 0, 4, x);
    TD_CHECK_EQ(at2(z, 3, 2), -5); /* tr[1][2] = base[2][1] */
    td_tensor_release(z);
    /* one input: a new tensor with its values, not the input */
    const td_tensor *one[1] = {x};
    TD_CHECK_OK(td_tensor_cat(one, 1, 0, &z));
    TD_CHECK(z != x && td_tensor_storage(z) != td_tensor_storage(x));
    TD_CHECK(td_tensor_equal(z, x));
    TD_CHECK_EQ(td_tensor_version(z), 0);
    td_tensor_release(z);
    td_tensor *all[] = {x, y, w, base, tr};
    release_n(all, 5);
}

/* torch.cat's result dtype is torch.promote_types over the inputs. */
TD_TEST(test_cat_host_dtypes)
{
    static const td_dtype pairs[][3] = {
        {TD_INT32, TD_FLOAT64, TD_FLOAT64},  {TD_BOOL, TD_INT8, TD_INT8},
        {TD_UINT8, TD_INT8, TD_INT16},       {TD_FLOAT16, TD_BFLOAT16, TD_FLOAT32},
        {TD_INT64, TD_COMPLEX64, TD_COMPLEX64}, {TD_FLOAT32, TD_FLOAT32, TD_FLOAT32},
    };
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        td_tensor *a = dev_host_arange(pairs[k][0], TD_SHAPE(2, 2), 1.0);
        td_tensor *b = dev_host_arange(pairs[k][1], TD_SHAPE(1, 2), 1.0);
        const td_tensor *in[2] = {a, b};
        td_tensor *z = NULL;
        TD_CHECK_OK(td_tensor_cat(in, 2, 0, &z));
        TD_CHECK_MSG(td_tensor_dtype(z) == pairs[k][2], "cat(%s, %s) gave %s", td_dtype_name(pairs[k][0]),
                     td_dtype_name(pairs[k][1]), td_dtype_name(td_tensor_dtype(z)));
        TD_CHECK_EQ(dev_get(z, 1), 1);
        TD_CHECK_EQ(dev_get(z, 3), pairs[k][0] == TD_BOOL ? 1 : 3);
        TD_CHECK_EQ(dev_get(z, 5), 1);
        td_tensor *all[] = {a, b, z};
        release_n(all, 3);
    }
}

/* torch.cat's legacy rule: 1-D tensors of size 0 are skipped in dim wrapping and the shape
 * checks; other empty tensors are not. */
TD_TEST(test_cat_host_skips_empty)
{
    td_tensor *x = dev_host_arange(TD_FLOAT32, TD_SHAPE(2, 3), 1.0), *e = NULL, *rows0 = NULL, *cols0 = NULL;
    TD_CHECK_OK(td_tensor_empty(TD_INT64, TD_SHAPE(0), &e));
    TD_CHECK_OK(td_tensor_empty(TD_FLOAT32, TD_SHAPE(0, 3), &rows0));
    TD_CHECK_OK(td_tensor_empty(TD_FLOAT32, TD_SHAPE(0, 2), &cols0));
    td_tensor *z = NULL;
    const td_tensor *ex[3] = {e, x, e};
    TD_CHECK_OK(td_tensor_cat(ex, 3, -1, &z)); /* -1 wraps against x, the first tensor not skipped */
    TD_CHECK_EQ(td_tensor_ndim(z), 2);
    TD_CHECK_EQ(td_tensor_dtype(z), TD_FLOAT32); /* promote(int64, float32): skipped tensors count */
    TD_CHECK(td_tensor_equal(z, x));
    td_tensor_release(z);
    const td_tensor *ee[2] = {e, e};
    TD_CHECK_OK(td_tensor_cat(ee, 2, 5, &z)); /* all skipped: a [0], dim never wrapped */
    TD_CHECK_EQ(td_tensor_ndim(z), 1);
    TD_CHECK_EQ(td_tensor_size(z, 0), 0);
    td_tensor_release(z);
    const td_tensor *xr[2] = {x, rows0};
    TD_CHECK_OK(td_tensor_cat(xr, 2, 0, &z));
    TD_CHECK(td_tensor_equal(z, x));
    td_tensor_release(z);
    const td_tensor *xc[2] = {x, cols0};
    TD_CHECK_ERR(td_tensor_cat(xc, 2, 0, &z), TD_ERR_INVALID,
                 "Sizes of tensors must match except in dimension 0. Expected size 3 but got size 2 for tensor number "
                 "1 in the list.");
    td_tensor *all[] = {x, e, rows0, cols0};
    release_n(all, 4);
}

TD_TEST(test_cat_host_errors)
{
    td_tensor *a = dev_host_arange(TD_FLOAT32, TD_SHAPE(2, 5), 1.0), *b = NULL, *c = NULL, *s = NULL, *z = NULL;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(2, 4), &b));
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(2, 5, 1), &c));
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE_SCALAR, &s));
    TD_CHECK_ERR(td_tensor_cat(NULL, 0, 0, &z), TD_ERR_INVALID, "torch.cat(): expected a non-empty list of Tensors");
    const td_tensor *ac[2] = {a, c}, *ab[2] = {a, b}, *as[2] = {a, s}, *anull[2] = {a, NULL};
    TD_CHECK_ERR(td_tensor_cat(ac, 2, 0, &z), TD_ERR_INVALID, "Tensors must have same number of dimensions: got 2 and 3");
    TD_CHECK_ERR(td_tensor_cat(ab, 2, 0, &z), TD_ERR_INVALID,
                 "Sizes of tensors must match except in dimension 0. Expected size 5 but got size 4 for tensor number "
                 "1 in the list.");
    TD_CHECK_OK(td_tensor_cat(ab, 2, 1, &z)); /* the same pair along dim 1 is fine */
    TD_CHECK_EQ(td_tensor_size(z, 1), 9);
    td_tensor_release(z);
    TD_CHECK_ERR(td_tensor_cat(as, 2, 0, &z), TD_ERR_INVALID,
                 "zero-dimensional tensor (at position 1) cannot be concatenated");
    TD_CHECK_ERR(td_tensor_cat(ab, 2, 2, &z), TD_ERR_INVALID, "Dimension out of range");
    TD_CHECK_ERR(td_tensor_cat(ab, 2, -3, &z), TD_ERR_INVALID, "Dimension out of range");
    TD_CHECK_ERR(td_tensor_cat(anull, 2, 0, &z), TD_ERR_INVALID, "tensor 1 is NULL");
    TD_CHECK_ERR(td_tensor_cat(ab, 2, 0, NULL), TD_ERR_INVALID, "out is NULL");
    TD_CHECK(z == NULL);
    td_tensor *all[] = {a, b, c, s};
    release_n(all, 4);
}

/* The result is channels_last when every input suggests it, contiguous otherwise. */
TD_TEST(test_cat_host_channels_last)
{
    td_tensor *p = nhwc_tensor(2, 1.0), *q = nhwc_tensor(1, -1.0), *plain = NULL, *z = NULL;
    TD_CHECK_OK(td_tensor_clone(q, &plain));
    const td_tensor *pq[2] = {p, q}, *pp[2] = {p, plain};
    TD_CHECK_OK(td_tensor_cat(pq, 2, 0, &z));
    TD_CHECK(channels_last_contiguous(z));
    TD_CHECK(!td_tensor_is_contiguous(z));
    check_slice(z, 0, 0, p);
    check_slice(z, 0, 2, q);
    td_tensor_release(z);
    const td_tensor *p2[2] = {p, p};
    TD_CHECK_OK(td_tensor_cat(p2, 2, 1, &z)); /* along C: still channels_last */
    TD_CHECK(channels_last_contiguous(z));
    TD_CHECK_EQ(td_tensor_size(z, 1), 6);
    check_slice(z, 1, 3, p);
    td_tensor_release(z);
    TD_CHECK_OK(td_tensor_cat(pp, 2, 0, &z));
    TD_CHECK(td_tensor_is_contiguous(z));
    check_slice(z, 0, 0, p);
    check_slice(z, 0, 2, plain);
    td_tensor *all[] = {p, q, plain, z};
    release_n(all, 4);
}

/* ---- devices -------------------------------------------------------------------------------- */

/* test_cat_autogpu: x and y on device 1 while the current device is 0 give a result on device 1;
 * the same with the roles swapped inside a guard. */
TD_TEST(test_cat_autogpu, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_tensor *hx = dev_host_arange(TD_FLOAT32, TD_SHAPE(4, 4), 0.5), *hy = dev_host_arange(TD_FLOAT32, TD_SHAPE(4, 4), -1.0);
    td_tensor *x = dev_to(hx, dev(1)), *y = dev_to(hy, dev(1)), *z = NULL;
    TD_CHECK_EQ(td_device_current(dev(0).type), 0);
    const td_tensor *xy[2] = {x, y};
    TD_CHECK_OK(td_tensor_cat(xy, 2, 0, &z));
    TD_CHECK(td_device_equal(td_tensor_device(z), td_tensor_device(x)));
    TD_CHECK(td_device_equal(td_tensor_device(z), dev(1)));
    TD_CHECK_EQ(td_tensor_size(z, 0), 8);
    check_slice(z, 0, 0, hx);
    check_slice(z, 0, 4, hy);
    td_tensor_release(z);
    /* inputs on 0, current device 1 */
    td_tensor *x0 = dev_to(hx, dev(0)), *y0 = dev_to(hy, dev(0));
    const td_tensor *xy0[2] = {x0, y0};
    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, dev(1)));
    TD_CHECK_OK(td_tensor_cat(xy0, 2, 1, &z));
    td_device_guard_exit(&g);
    TD_CHECK(td_device_equal(td_tensor_device(z), dev(0)));
    TD_CHECK_EQ(td_tensor_size(z, 1), 8);
    check_slice(z, 1, 0, hx);
    check_slice(z, 1, 4, hy);
    td_tensor *all[] = {hx, hy, x, y, z, x0, y0};
    release_n(all, 7);
    dev_finish();
}

/* One device: dims, several inputs (one non-contiguous), dtype promotion (converted through the
 * host), channels_last, skipped 1-D empty tensors, and the messages. */
TD_TEST(test_cat_device, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_device d0 = dev(0);
    td_tensor *hx = dev_host_arange(TD_FLOAT32, TD_SHAPE(2, 3), 1.0), *hb = dev_host_arange(TD_FLOAT32, TD_SHAPE(3, 2), 2.0);
    td_tensor *x = dev_to(hx, d0), *b = dev_to(hb, d0), *tr = NULL, *z = NULL, *hz = NULL;
    TD_CHECK_OK(td_tensor_transpose(b, 0, 1, &tr));
    const td_tensor *dev_in[3] = {x, tr, x};
    td_tensor *htr = NULL;
    TD_CHECK_OK(td_tensor_transpose(hb, 0, 1, &htr));
    const td_tensor *host_in[3] = {hx, htr, hx};
    for (int dim = -2; dim < 2; dim++) {
        TD_CHECK_OK(td_tensor_cat(dev_in, 3, dim, &z));
        TD_CHECK_OK(td_tensor_cat(host_in, 3, dim, &hz));
        TD_CHECK(td_device_equal(td_tensor_device(z), d0));
        TD_CHECK(td_tensor_is_contiguous(z));
        TD_CHECK(td_tensor_equal(z, hz));
        td_tensor_release(z);
        td_tensor_release(hz);
    }
    /* int32 and float32 on a device: float32, as torch.cat */
    td_tensor *hi = dev_host_arange(TD_INT32, TD_SHAPE(1, 3), 7.0), *di = dev_to(hi, d0);
    const td_tensor *mixed[2] = {x, di};
    TD_CHECK_OK(td_tensor_cat(mixed, 2, 0, &z));
    TD_CHECK_EQ(td_tensor_dtype(z), TD_FLOAT32);
    TD_CHECK(td_device_equal(td_tensor_device(z), d0));
    TD_CHECK_EQ(at2(z, 2, 2), 14);
    check_slice(z, 0, 0, hx);
    td_tensor_release(z);
    /* channels_last inputs give a channels_last result on the device */
    td_tensor *hp = nhwc_tensor(2, 1.0), *p = dev_to(hp, d0);
    TD_CHECK(channels_last_contiguous(p));
    const td_tensor *pp[2] = {p, p};
    TD_CHECK_OK(td_tensor_cat(pp, 2, 0, &z));
    TD_CHECK(channels_last_contiguous(z));
    check_slice(z, 0, 0, hp);
    check_slice(z, 0, 2, hp);
    td_tensor_release(z);
    /* a skipped [0] on the device */
    td_tensor *e = NULL;
    TD_CHECK_OK(td_tensor_empty_on(d0, TD_FLOAT32, TD_SHAPE(0), NULL, &e));
    const td_tensor *ex[2] = {e, x};
    TD_CHECK_OK(td_tensor_cat(ex, 2, 1, &z));
    TD_CHECK(td_device_equal(td_tensor_device(z), d0));
    TD_CHECK(td_tensor_equal(z, hx));
    td_tensor_release(z);
    /* messages */
    char want[160], name[32];
    const td_tensor *host_dev[2] = {hx, x};
    snprintf(want, sizeof want, "Expected all tensors to be on the same device, but found at least two devices, cpu and %s!",
             td_device_str(d0, name, sizeof name));
    TD_CHECK_ERR(td_tensor_cat(host_dev, 2, 0, &z), TD_ERR_INVALID, want);
    td_tensor *narrow = NULL;
    TD_CHECK_OK(td_tensor_narrow(x, 1, 0, 2, &narrow));
    const td_tensor *bad[2] = {x, narrow};
    TD_CHECK_ERR(td_tensor_cat(bad, 2, 0, &z), TD_ERR_INVALID,
                 "Sizes of tensors must match except in dimension 0. Expected size 3 but got size 2 for tensor number "
                 "1 in the list.");
    td_tensor *all[] = {hx, hb, x, b, tr, htr, hi, di, hp, p, e, narrow};
    release_n(all, 12);
    dev_finish();
}

TD_TEST(test_cat_two_devices_error, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_tensor *h = dev_host_arange(TD_FLOAT32, TD_SHAPE(2, 2), 1.0), *x = dev_to(h, dev(0)), *y = dev_to(h, dev(1));
    char want[160], n0[32], n1[32];
    snprintf(want, sizeof want,
             "Expected all tensors to be on the same device, but found at least two devices, %s and %s!",
             td_device_str(dev(0), n0, sizeof n0), td_device_str(dev(1), n1, sizeof n1));
    const td_tensor *xy[2] = {x, y};
    td_tensor *z = NULL;
    TD_CHECK_ERR(td_tensor_cat(xy, 2, 0, &z), TD_ERR_INVALID, want);
    TD_CHECK(z == NULL);
    td_tensor *all[] = {h, x, y};
    release_n(all, 3);
    dev_finish();
}

TD_TEST_MAIN()
