/* Device tensors and copies (spec/cuda_multigpu.md sections 1 and 5), named after the
 * test_cuda_multigpu.py tests they port: the two-way barrier of cross-device copies under a 50M
 * cycle sleep (test_copy_streams), to_device identity and placement (test_copy_device,
 * test_autogpu, test_tensor_device), device memory counted on its device only
 * (test_cuda_device_memory_allocated), and the copy paths the tests rely on: host round trips of
 * every dtype, non-contiguous operands, dtype conversion, pinned non-blocking copies, version
 * counters and the host-only functions refusing device tensors. A body the seed runs across two
 * devices takes the device count: under the seed's name with devices 0 and 1, and as a
 * *_one_device (or *_same_device) case with device 0 in both roles, which one GPU runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/device.h>
#include <tdist/testing.h>

#include "device_util.h"

#define FIFTY_MIL_CYCLES 50000000LL

static const td_device cpu = {TD_DEVICE_CPU, -1};

static int device_index_of(const td_tensor *t) { return td_tensor_device(t).index; }

/* _test_copy_sync_current_stream: the copy into y waits for y's current stream and y's current
 * stream waits for the copy, so a later copy cannot overtake a delayed one. */
static void copy_sync_current_stream(td_tensor *x, td_tensor *y)
{
    td_device dx = td_tensor_device(x), dy = td_tensor_device(y);
    td_tensor *x_plus_one = NULL;
    TD_CHECK_OK(td_tensor_full_on(dx, TD_FLOAT32, td_tensor_shape(x), 1.0, &x_plus_one));
    /* x, y and x_plus_one were filled on their devices' default streams: the copies below run on
     * other streams, so both devices finish those fills first (a race otherwise, which sim under
     * ThreadSanitizer shows and a GPU hides behind the 50M-cycle sleep). */
    TD_CHECK_OK(td_device_synchronize(dx));
    TD_CHECK_OK(td_device_synchronize(td_tensor_device(y)));
    td_stream *s0, *s1, *s2, *s3;
    TD_CHECK_OK(td_stream_create(dx, 0, &s0));
    TD_CHECK_OK(td_stream_create(dy, 0, &s1));
    TD_CHECK_OK(td_stream_create(dx, 0, &s2));
    TD_CHECK_OK(td_stream_create(dy, 0, &s3));
    td_stream_guard g0, g1;

    /* same dst stream, different src streams */
    TD_CHECK_OK(td_stream_guard_enter(&g0, s0));
    TD_CHECK_OK(td_stream_sleep(s0, FIFTY_MIL_CYCLES));
    TD_CHECK_OK(td_stream_guard_enter(&g1, s1));
    TD_CHECK_OK(td_tensor_copy(y, x_plus_one));
    td_stream_guard_exit(&g1);
    td_stream_guard_exit(&g0);
    TD_CHECK_OK(td_stream_guard_enter(&g0, s2));
    TD_CHECK_OK(td_stream_guard_enter(&g1, s1));
    TD_CHECK_OK(td_tensor_copy(y, x));
    td_stream_guard_exit(&g1);
    td_stream_guard_exit(&g0);
    TD_CHECK_OK(td_stream_synchronize(s1));
    TD_CHECK(td_tensor_equal(y, x));

    /* same src stream, different dst streams */
    TD_CHECK_OK(td_stream_guard_enter(&g0, s1));
    TD_CHECK_OK(td_stream_sleep(s1, FIFTY_MIL_CYCLES));
    TD_CHECK_OK(td_stream_guard_enter(&g1, s0));
    TD_CHECK_OK(td_tensor_copy(y, x_plus_one));
    td_stream_guard_exit(&g1);
    td_stream_guard_exit(&g0);
    TD_CHECK_OK(td_stream_guard_enter(&g0, s3));
    TD_CHECK_OK(td_stream_guard_enter(&g1, s0));
    TD_CHECK_OK(td_tensor_copy(y, x));
    td_stream_guard_exit(&g1);
    td_stream_guard_exit(&g0);
    TD_CHECK_OK(td_stream_synchronize(s0));
    TD_CHECK(td_tensor_equal(y, x));

    TD_CHECK_OK(td_device_synchronize(dx));
    TD_CHECK_OK(td_device_synchronize(dy));
    td_stream_release(s0);
    td_stream_release(s1);
    td_stream_release(s2);
    td_stream_release(s3);
    td_tensor_release(x_plus_one);
}

/* test_copy_streams: x on device 0 copied into y on device `to_index`; the seed checks both the
 * cross-device pair (0 -> 1) and the same-device one (0 -> 0), the second needing one device. */
static void copy_streams_case(td_test_ctx *ctx, int need, int to_index)
{
    dev_setup(ctx, need);
    td_tensor *x = NULL, *y = NULL;
    TD_CHECK_OK(td_tensor_full_on(dev(0), TD_FLOAT32, TD_SHAPE(5, 5), 0.0, &x));
    TD_CHECK_OK(td_tensor_full_on(dev(to_index), TD_FLOAT32, TD_SHAPE(5, 5), 0.0, &y));
    copy_sync_current_stream(x, y);
    td_tensor_release(x);
    td_tensor_release(y);
    dev_finish();
}

TD_TEST(test_copy_streams, DEV_CASE) { copy_streams_case(ctx, 2, 1); }
TD_TEST(test_copy_streams_same_device, DEV_CASE) { copy_streams_case(ctx, 1, 0); }

/* test_copy_device with device `other` current: dev_to(current) moves a tensor there, and dev_to() onto
 * the device a tensor is on returns the tensor itself. With one device, other is device 0. */
static void copy_device_case(td_test_ctx *ctx, int need)
{
    dev_setup(ctx, need);
    td_device other = dev(need - 1);
    td_tensor *host = dev_host_arange(TD_FLOAT32, TD_SHAPE(5, 5), 0.5);
    td_tensor *sources[2] = {dev_to(host, dev(0)), td_tensor_retain(host)};
    for (int k = 0; k < 2; k++) {
        td_tensor *x = sources[k];
        td_device_guard g;
        TD_CHECK_OK(td_device_guard_enter(&g, other));
        td_tensor *y = dev_to(x, dev_current());
        TD_CHECK_EQ(device_index_of(y), other.index);
        td_tensor *same = dev_to(y, dev_current());
        TD_CHECK(same == y); /* assertIs(y.cuda(), y) */
        td_tensor *z = dev_to(y, dev(0));
        TD_CHECK_EQ(device_index_of(z), 0);
        td_tensor *same_z = dev_to(z, dev(0));
        TD_CHECK(same_z == z);
        TD_CHECK(td_tensor_equal(z, host));
        td_device_guard_exit(&g);
        td_tensor_release(same_z);
        td_tensor_release(z);
        td_tensor_release(same);
        td_tensor_release(y);
    }
    td_tensor_release(sources[0]);
    td_tensor_release(sources[1]);
    td_tensor_release(host);
    dev_finish();
}

TD_TEST(test_copy_device, DEV_CASE) { copy_device_case(ctx, 2); }
TD_TEST(test_copy_device_one_device, DEV_CASE) { copy_device_case(ctx, 1); }

/* test_autogpu with device `other` current inside the guard (device 0 with one device): new
 * tensors go to the current device, ops follow their inputs. */
static void autogpu_case(td_test_ctx *ctx, int need)
{
    dev_setup(ctx, need);
    td_device other = dev(need - 1);
    td_tensor *hx = dev_host_arange(TD_FLOAT32, TD_SHAPE(5, 5), 1.0);
    td_tensor *hy = dev_host_arange(TD_FLOAT32, TD_SHAPE(5, 5), 3.0);
    td_tensor *x = dev_to(hx, dev_current()), *y = dev_to(hy, dev_current());
    TD_CHECK_EQ(device_index_of(x), 0);
    TD_CHECK_EQ(device_index_of(y), 0);
    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, other));
    td_tensor *z = dev_to(hx, dev_current());
    TD_CHECK_EQ(device_index_of(z), other.index);
    td_tensor *q = NULL;
    TD_CHECK_OK(td_tensor_add(x, y, &q)); /* ops follow their inputs */
    TD_CHECK_EQ(device_index_of(q), 0);
    td_tensor *hq = NULL;
    TD_CHECK_OK(td_tensor_add(hx, hy, &hq));
    TD_CHECK(td_tensor_equal(q, hq));
    td_tensor *w = dev_to(hy, dev_current());
    TD_CHECK_EQ(device_index_of(w), other.index);
    td_tensor *y1 = dev_to(y, dev_current());
    TD_CHECK_EQ(device_index_of(y1), other.index);
    td_device_guard_exit(&g);
    td_tensor *z0 = dev_to(z, dev_current());
    TD_CHECK_EQ(device_index_of(z0), 0);
    /* add across devices or of other shapes is refused, not computed on the wrong device */
    td_tensor *bad = NULL;
    if (other.index != 0)
        TD_CHECK_ERR(td_tensor_add(x, z, &bad), TD_ERR_UNSUPPORTED, "expected both tensors on the same device");
    TD_CHECK_ERR(td_tensor_add(x, hy, &bad), TD_ERR_UNSUPPORTED, "expected both tensors on the same device");
    td_tensor *xs[] = {x, y, z, q, hq, w, y1, z0, hx, hy};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++)
        td_tensor_release(xs[i]);
    dev_finish();
}

TD_TEST(test_autogpu, DEV_CASE) { autogpu_case(ctx, 2); }
TD_TEST(test_autogpu_one_device, DEV_CASE) { autogpu_case(ctx, 1); }

/* test_tensor_device with device `other` current inside the guard (device 0 with one device):
 * factories without a device use the current one, an explicit device wins. */
static void tensor_device_case(td_test_ctx *ctx, int need)
{
    dev_setup(ctx, need);
    td_device other = dev(need - 1);
    td_tensor *a, *b, *c, *d;
    TD_CHECK_OK(td_tensor_empty_on(dev_current(), TD_FLOAT32, TD_SHAPE(1), NULL, &a));
    TD_CHECK_EQ(device_index_of(a), 0);
    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, other));
    TD_CHECK_OK(td_tensor_empty_on(dev_current(), TD_FLOAT32, TD_SHAPE(1), NULL, &b));
    TD_CHECK_EQ(device_index_of(b), other.index);
    TD_CHECK_OK(td_tensor_full_on(dev(0), TD_FLOAT32, TD_SHAPE(1), 2.0, &c)); /* explicit device wins */
    TD_CHECK_EQ(device_index_of(c), 0);
    TD_CHECK_OK(td_tensor_full_on(cpu, TD_FLOAT32, TD_SHAPE(1), 2.0, &d));
    TD_CHECK(td_device_equal(td_tensor_device(d), cpu));
    td_device_guard_exit(&g);
    TD_CHECK(td_device_equal(td_tensor_device(c), dev(0)));
    TD_CHECK(td_tensor_equal(c, d));
    TD_CHECK_NEAR(dev_get(c, 0), 2.0, 0);
    /* an index past the last device */
    td_device bad = dev(0);
    bad.index = 63;
    td_tensor *e = NULL;
    TD_CHECK_ERR(td_tensor_empty_on(bad, TD_FLOAT32, TD_SHAPE(1), NULL, &e), TD_ERR_INVALID, "Invalid device ordinal");
    td_tensor_release(a);
    td_tensor_release(b);
    td_tensor_release(c);
    td_tensor_release(d);
    dev_finish();
}

TD_TEST(test_tensor_device, DEV_CASE) { tensor_device_case(ctx, 2); }
TD_TEST(test_tensor_device_one_device, DEV_CASE) { tensor_device_case(ctx, 1); }

/* A tensor on device 0 counts on device 0 and, with two devices or more, on no other. */
static void device_memory_allocated_case(td_test_ctx *ctx, int need)
{
    dev_setup(ctx, need);
    int n = td_device_count(dev(0).type);
    int64_t before[64];
    for (int i = 0; i < n && i < 64; i++)
        before[i] = td_memory_allocated(dev(i));
    td_tensor *x = NULL;
    TD_CHECK_OK(td_tensor_full_on(dev(0), TD_FLOAT32, TD_SHAPE(10), 1.0, &x));
    TD_CHECK(td_memory_allocated(dev(0)) > before[0]);
    for (int i = 1; i < n && i < 64; i++)
        TD_CHECK_EQ(td_memory_allocated(dev(i)), before[i]);
    td_tensor_release(x);
    TD_CHECK_EQ(td_memory_allocated(dev(0)), before[0]);
    dev_finish();
}

TD_TEST(test_cuda_device_memory_allocated, DEV_CASE) { device_memory_allocated_case(ctx, 2); }
TD_TEST(test_device_memory_allocated_one_device, DEV_CASE) { device_memory_allocated_case(ctx, 1); }

/* Every dtype host -> device 0 -> device `other` -> host, and full_on on other (device 0 with one
 * device: the device hop is then dev_to() onto the tensor's own device). */
static void dtypes_round_trip_case(td_test_ctx *ctx, int need)
{
    dev_setup(ctx, need);
    td_device other = dev(need - 1);
    for (int dt = 0; dt < TD_DTYPE_COUNT; dt++) {
        td_tensor *host = dev_host_arange((td_dtype)dt, TD_SHAPE(3, 7), 1.0);
        td_tensor *on0 = dev_to(host, dev(0));
        td_tensor *on1 = dev_to(on0, other);
        td_tensor *back = dev_to(on1, cpu);
        TD_CHECK_MSG(td_tensor_equal(back, host), "round trip of %s changed the values", td_dtype_name((td_dtype)dt));
        TD_CHECK_EQ(td_tensor_dtype(on1), dt);
        /* full_on writes the value in the dtype through the fill kernel */
        td_tensor *filled = NULL, *hfilled = NULL;
        TD_CHECK_OK(td_tensor_full_on(other, (td_dtype)dt, TD_SHAPE(4), 3.0, &filled));
        TD_CHECK_OK(td_tensor_full((td_dtype)dt, TD_SHAPE(4), 3.0, &hfilled));
        TD_CHECK(td_tensor_equal(filled, hfilled));
        td_tensor_release(filled);
        td_tensor_release(hfilled);
        td_tensor_release(back);
        td_tensor_release(on1);
        td_tensor_release(on0);
        td_tensor_release(host);
    }
    dev_finish();
}

TD_TEST(test_copy_dtypes_round_trip, DEV_CASE) { dtypes_round_trip_case(ctx, 2); }
TD_TEST(test_copy_dtypes_round_trip_one_device, DEV_CASE) { dtypes_round_trip_case(ctx, 1); }

/* Non-contiguous copies between device 0 and device `other`, the host and both (with one device,
 * other is device 0 and every device-to-device copy stays on it). */
static void non_contiguous_case(td_test_ctx *ctx, int need)
{
    dev_setup(ctx, need);
    td_device other = dev(need - 1);
    td_tensor *host = dev_host_arange(TD_FLOAT64, TD_SHAPE(4, 6), 1.0);
    td_tensor *ht = NULL, *hn = NULL;
    TD_CHECK_OK(td_tensor_transpose(host, 0, 1, &ht)); /* dense, not contiguous */
    TD_CHECK_OK(td_tensor_narrow(host, 1, 1, 3, &hn)); /* not dense */

    /* to_device keeps a dense tensor's strides and makes others contiguous */
    td_tensor *dt = dev_to(ht, dev(0)), *dn = dev_to(hn, other);
    TD_CHECK_EQ(td_tensor_stride(dt, 0), 1);
    TD_CHECK_EQ(td_tensor_stride(dt, 1), 6);
    TD_CHECK(td_tensor_is_contiguous(dn));
    TD_CHECK(td_tensor_equal(dt, ht));
    TD_CHECK(td_tensor_equal(dn, hn));

    /* device to device into a strided view, same device and across devices */
    td_tensor *big0 = NULL, *big1 = NULL, *v0 = NULL, *v1 = NULL;
    TD_CHECK_OK(td_tensor_full_on(dev(0), TD_FLOAT64, TD_SHAPE(4, 8), -1.0, &big0));
    TD_CHECK_OK(td_tensor_full_on(other, TD_FLOAT64, TD_SHAPE(4, 8), -1.0, &big1));
    TD_CHECK_OK(td_tensor_narrow(big0, 1, 2, 3, &v0));
    TD_CHECK_OK(td_tensor_narrow(big1, 1, 5, 3, &v1));
    TD_CHECK_OK(td_tensor_copy(v0, dn)); /* dev1 contiguous -> dev0 strided */
    TD_CHECK(td_tensor_equal(v0, hn));
    TD_CHECK_OK(td_tensor_copy(v1, v0)); /* dev0 strided -> dev1 strided */
    TD_CHECK(td_tensor_equal(v1, hn));
    TD_CHECK_NEAR(dev_get(big1, 0), -1.0, 0); /* outside the view untouched */
    TD_CHECK_NEAR(dev_get(big1, 5), 1.0, 0);
    td_tensor *t0 = NULL;
    TD_CHECK_OK(td_tensor_transpose(dt, 0, 1, &t0)); /* dev0 [4, 6] with strides [1, 4] transposed back */
    td_tensor *c0 = NULL;
    TD_CHECK_OK(td_tensor_empty_on(dev(0), TD_FLOAT64, TD_SHAPE(4, 6), NULL, &c0));
    TD_CHECK_OK(td_tensor_copy(c0, t0)); /* same device, strided kernel */
    TD_CHECK(td_tensor_equal(c0, host));

    /* device to a strided host view, and a broadcast source */
    td_tensor *hbig = NULL, *hv = NULL;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT64, TD_SHAPE(4, 8), &hbig));
    TD_CHECK_OK(td_tensor_narrow(hbig, 1, 4, 3, &hv));
    TD_CHECK_OK(td_tensor_copy(hv, v1));
    TD_CHECK(td_tensor_equal(hv, hn));
    td_tensor *row = dev_host_arange(TD_FLOAT64, TD_SHAPE(6), 2.0);
    TD_CHECK_OK(td_tensor_copy(c0, row)); /* host [6] broadcast into device [4, 6] */
    TD_CHECK_NEAR(dev_get(c0, 6 * 3 + 5), 10.0, 0);

    /* dtype conversion happens on the host, in both directions and between devices */
    td_tensor *f32 = NULL, *i32 = NULL, *hf = NULL, *hi = NULL;
    TD_CHECK_OK(td_tensor_empty_on(other, TD_FLOAT32, TD_SHAPE(4, 6), NULL, &f32));
    TD_CHECK_OK(td_tensor_copy(f32, host));
    TD_CHECK_OK(td_tensor_to(host, TD_FLOAT32, &hf));
    TD_CHECK(td_tensor_equal(f32, hf));
    TD_CHECK_OK(td_tensor_empty_on(dev(0), TD_INT32, TD_SHAPE(4, 6), NULL, &i32));
    TD_CHECK_OK(td_tensor_copy(i32, f32));
    TD_CHECK_OK(td_tensor_to(host, TD_INT32, &hi));
    TD_CHECK(td_tensor_equal(i32, hi));
    TD_CHECK_OK(td_tensor_copy(host, i32)); /* device int32 into host float64 */
    TD_CHECK_NEAR(dev_get(host, 23), 23.0, 0);

    /* zero elements and dst == src do nothing */
    td_tensor *empty0 = NULL, *empty1 = NULL;
    TD_CHECK_OK(td_tensor_empty_on(dev(0), TD_FLOAT32, TD_SHAPE(0, 3), NULL, &empty0));
    TD_CHECK_OK(td_tensor_empty_on(other, TD_FLOAT32, TD_SHAPE(0, 3), NULL, &empty1));
    TD_CHECK_OK(td_tensor_copy_ex(empty1, empty0, true));
    TD_CHECK_OK(td_tensor_copy_ex(f32, f32, false));
    TD_CHECK(td_tensor_equal(f32, hf));

    td_tensor *all[] = {host, ht, hn, dt, dn, big0, big1, v0, v1, t0, c0, hbig, hv, row, f32, i32, hf, hi, empty0, empty1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_tensor_release(all[i]);
    dev_finish();
}

TD_TEST(test_copy_non_contiguous, DEV_CASE) { non_contiguous_case(ctx, 2); }
TD_TEST(test_copy_non_contiguous_same_device, DEV_CASE) { non_contiguous_case(ctx, 1); }

TD_TEST(test_copy_pinned_non_blocking, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_tensor *host = dev_host_arange(TD_FLOAT32, TD_SHAPE(256), 1.0);
    td_tensor *pinned = NULL;
    TD_CHECK_OK(td_tensor_pin_memory(host, &pinned));
    TD_CHECK(td_tensor_is_pinned(pinned));
    TD_CHECK(!td_tensor_is_pinned(host));
    TD_CHECK(td_tensor_equal(pinned, host));
    td_stream *cur = NULL;
    TD_CHECK_OK(td_stream_current(dev(0), &cur));

    /* non-blocking from pinned memory returns with the copy still queued behind the sleep */
    td_tensor *d = NULL;
    TD_CHECK_OK(td_tensor_empty_on(dev(0), TD_FLOAT32, TD_SHAPE(256), NULL, &d));
    TD_CHECK_OK(td_stream_sleep(cur, FIFTY_MIL_CYCLES));
    TD_CHECK_OK(td_tensor_copy_ex(d, pinned, true));
    TD_CHECK(!td_stream_query(cur));
    TD_CHECK_OK(td_stream_synchronize(cur));
    TD_CHECK(td_tensor_equal(d, host));

    /* a blocking copy (or a pageable source) returns when the data has arrived */
    TD_CHECK_OK(td_stream_sleep(cur, FIFTY_MIL_CYCLES));
    TD_CHECK_OK(td_tensor_copy_ex(d, host, true));
    TD_CHECK(td_stream_query(cur));

    /* device to pinned host memory, non-blocking */
    td_tensor *hout = NULL, *pout = NULL;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(256), &hout));
    TD_CHECK_OK(td_tensor_pin_memory(hout, &pout));
    TD_CHECK_OK(td_stream_sleep(cur, FIFTY_MIL_CYCLES));
    TD_CHECK_OK(td_tensor_copy_ex(pout, d, true));
    TD_CHECK(!td_stream_query(cur));
    TD_CHECK_OK(td_stream_synchronize(cur));
    TD_CHECK(td_tensor_equal(pout, host));
    /* pinning a device tensor is refused */
    td_tensor *bad = NULL;
    TD_CHECK_ERR(td_tensor_pin_memory(d, &bad), TD_ERR_INVALID, "only dense CPU tensors can be pinned");

    td_tensor_release(d);
    td_tensor_release(pout);
    td_tensor_release(hout);
    td_tensor_release(pinned);
    td_tensor_release(host);
    TD_CHECK_OK(td_host_empty_cache());
    dev_finish();
}

TD_TEST(test_tensor_version_and_host_only, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_tensor *x = NULL, *view = NULL, *h = dev_host_arange(TD_FLOAT32, TD_SHAPE(2, 3), 1.0);
    TD_CHECK_OK(td_tensor_full_on(dev(0), TD_FLOAT32, TD_SHAPE(2, 3), 1.0, &x));
    TD_CHECK_EQ(td_tensor_version(x), 0);
    TD_CHECK_OK(td_tensor_select(x, 0, 1, &view));
    TD_CHECK_OK(td_tensor_fill(view, 7.0)); /* a strided fill on a device view */
    TD_CHECK_EQ(td_tensor_version(x), 1);   /* views share the counter */
    TD_CHECK_NEAR(dev_get(x, 0), 1.0, 0);
    TD_CHECK_NEAR(dev_get(x, 4), 7.0, 0);
    TD_CHECK_OK(td_tensor_copy(x, h));
    TD_CHECK_EQ(td_tensor_version(view), 2);
    uint64_t hv = td_tensor_version(h);
    int64_t idx[2] = {0, 0};
    TD_CHECK_OK(td_tensor_set_f64(h, idx, 5.0));
    TD_CHECK_EQ(td_tensor_version(h), hv + 1);

    /* host-only functions refuse device tensors by name */
    char name[32], want[160];
    td_device_str(dev(0), name, sizeof name);
    snprintf(want, sizeof want, "td_tensor_get_f64 needs a CPU tensor, but got a tensor on %s: copy it to the host first",
             name);
    double v;
    TD_CHECK_ERR(td_tensor_get_f64(x, idx, &v), TD_ERR_UNSUPPORTED, want);
    TD_CHECK_ERR(td_tensor_set_f64(x, idx, 1.0), TD_ERR_UNSUPPORTED, "td_tensor_set_f64 needs a CPU tensor");
    float buf[6];
    TD_CHECK_ERR(td_tensor_read(x, buf, sizeof buf), TD_ERR_UNSUPPORTED, "td_tensor_read needs a CPU tensor");
    td_tensor *out = NULL;
    TD_CHECK_ERR(td_tensor_sub(x, x, &out), TD_ERR_UNSUPPORTED, "td_tensor_sub is not supported on device tensors");
    TD_CHECK_ERR(td_tensor_sum(x, &out), TD_ERR_UNSUPPORTED, "td_tensor_sum is not supported on device tensors");
    /* printing reads a host copy and names the device, as torch prints a cuda tensor */
    char *s = td_tensor_format(x);
    snprintf(want, sizeof want, "device='%s'", name);
    TD_CHECK_CONTAINS(s, want);
    TD_CHECK_CONTAINS(s, "[3., 4., 5.]]");
    free(s);
    td_tensor_release(view);
    td_tensor_release(x);
    td_tensor_release(h);
    dev_finish();
}

TD_TEST_MAIN()
