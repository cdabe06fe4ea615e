/* The comm primitives (spec/cuda_multigpu.md section 9), named after the test_cuda_multigpu.py
 * tests they port: broadcast (cpu and device sources, the out form and its messages), the
 * coalesced broadcast and reduce_add over dense tensors (sparse tensors do not exist in tdist),
 * reduce_add, scatter and gather along every dim the seed uses with every [T] message of
 * Appendix A, and channels_last kept through scatter and gather. The Python-only keyword messages
 * ("Exactly one of 'devices' and 'out'", "'devices' must not be specified", "'destination' must not
 * be specified") cannot happen: the keyword forms are separate functions. Broadcast, reduce_add,
 * scatter from the host and gather also run as *_one_device cases with device 0 in the second
 * device's place, which one GPU runs. */
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

/* ---- broadcast ---------------------------------------------------------------------------- */

/* Onto devices 0 and `other` (device 0 again with one device: both results on it). */
static void check_broadcast(td_tensor *input, td_device other)
{
    td_device devs[2] = {dev(0), other};
    td_tensor *res[2];
    TD_CHECK_OK(td_comm_broadcast(input, devs, 2, res));
    for (int i = 0; i < 2; i++) {
        TD_CHECK(td_device_equal(td_tensor_device(res[i]), devs[i]));
        TD_CHECK(td_tensor_equal(res[i], input));
    }
    if (td_device_equal(td_tensor_device(input), dev(0))) {
        TD_CHECK(res[0] == input);
        TD_CHECK(td_tensor_data(res[0]) == td_tensor_data(input));
    } else {
        TD_CHECK(td_tensor_data(res[0]) != td_tensor_data(input));
    }
    /* out= */
    td_tensor *outs[2] = {dev_to(input, dev(0)), NULL};
    TD_CHECK_OK(td_tensor_full_on(other, td_tensor_dtype(input), td_tensor_shape(input), -1.0, &outs[1]));
    TD_CHECK_OK(td_comm_broadcast_out(input, outs, 2));
    TD_CHECK(td_tensor_equal(outs[0], input));
    TD_CHECK(td_tensor_equal(outs[1], input));
    /* messages, the device check before the shape check per index */
    td_tensor *on_cpu = dev_to(input, cpu), *unsq = NULL;
    TD_CHECK_OK(td_tensor_unsqueeze(outs[1], 0, &unsq));
    td_tensor *bad1[2] = {outs[0], on_cpu};
    TD_CHECK_ERR(td_comm_broadcast_out(input, bad1, 2), TD_ERR_INVALID,
                 "Expected all output tensors to be CUDA tensors, but output tensor at index 1 has device 'cpu'");
    td_tensor *bad2[2] = {outs[0], unsq};
    TD_CHECK_ERR(td_comm_broadcast_out(input, bad2, 2), TD_ERR_INVALID,
                 "Expected all output tensors to have same shape as the source tensor [5, 5], but output tensor at "
                 "index 1 has shape [1, 5, 5]");
    td_device negative[2] = {dev(0), other};
    negative[1].index = -1;
    td_tensor *never[2] = {NULL, NULL};
    TD_CHECK_ERR(td_comm_broadcast(input, negative, 2, never), TD_ERR_INVALID,
                 "Expected non-negative device index, but got -1");
    td_device with_cpu[2] = {dev(0), cpu};
    TD_CHECK_ERR(td_comm_broadcast(input, with_cpu, 2, never), TD_ERR_INVALID, "device, but got: cpu");
    td_tensor_release(on_cpu);
    td_tensor_release(unsq);
    release_n(outs, 2);
    release_n(res, 2);
}

/* test_broadcast_cpu and _gpu: the source on the host or device 0; with one device, both
 * destinations are device 0. */
static void broadcast_case(td_test_ctx *ctx, int need, bool gpu)
{
    dev_setup(ctx, need);
    td_tensor *host = dev_host_arange(TD_FLOAT32, TD_SHAPE(5, 5), 0.25);
    td_tensor *input = gpu ? dev_to(host, dev(0)) : td_tensor_retain(host);
    check_broadcast(input, dev(need - 1));
    td_tensor_release(input);
    td_tensor_release(host);
    dev_finish();
}

TD_TEST(test_broadcast_cpu, DEV_CASE) { broadcast_case(ctx, 2, false); }
TD_TEST(test_broadcast_gpu, DEV_CASE) { broadcast_case(ctx, 2, true); }
TD_TEST(test_broadcast_cpu_one_device, DEV_CASE) { broadcast_case(ctx, 1, false); }
TD_TEST(test_broadcast_gpu_one_device, DEV_CASE) { broadcast_case(ctx, 1, true); }

/* ---- coalesced ---------------------------------------------------------------------------- */

#define NT 6

/* The seed's dense set on device 0: int64[5] x3, float32[5] x2, int32[10], interleaved. */
static void dense_tensors(td_tensor **t)
{
    const td_dtype dts[NT] = {TD_INT64, TD_FLOAT32, TD_INT64, TD_INT64, TD_INT32, TD_FLOAT32};
    const int64_t sizes[NT] = {5, 5, 5, 5, 10, 5};
    for (int i = 0; i < NT; i++) {
        td_tensor *h = dev_host_arange(dts[i], TD_SHAPE(sizes[i]), (double)(i + 1));
        t[i] = dev_to(h, dev(0));
        td_tensor_release(h);
    }
}

static void check_broadcast_coalesced(td_tensor **tensors, int nt, size_t buffer_size)
{
    td_device devs[2] = {dev(0), dev(1)};
    td_tensor *ref[2 * NT];
    for (int i = 0; i < nt; i++) {
        td_tensor *pair[2];
        TD_CHECK_OK(td_comm_broadcast(tensors[i], devs, 2, pair));
        ref[i] = pair[0];
        ref[nt + i] = pair[1];
    }
    td_tensor *bc[2 * NT];
    TD_CHECK_OK(td_comm_broadcast_coalesced(tensors, nt, devs, 2, buffer_size, bc));
    for (int d = 0; d < 2; d++) {
        for (int i = 0; i < nt; i++) {
            td_tensor *t = bc[d * nt + i];
            TD_CHECK(td_device_equal(td_tensor_device(t), dev(d)));
            TD_CHECK_EQ(td_tensor_dtype(t), td_tensor_dtype(tensors[i]));
            TD_CHECK(td_tensor_equal(t, ref[d * nt + i]));
        }
    }
    for (int i = 0; i < nt; i++)
        TD_CHECK(bc[i] == tensors[i]); /* the devices[0] row is the inputs */
    /* each device-1 output has its own version counter */
    for (int i = 0; i < nt; i++) {
        uint64_t before[NT];
        for (int k = 0; k < nt; k++)
            before[k] = td_tensor_version(bc[nt + k]);
        TD_CHECK_OK(td_tensor_fill(bc[nt + i], 0.0));
        for (int k = 0; k < nt; k++)
            TD_CHECK_EQ(td_tensor_version(bc[nt + k]), before[k] + (k == i));
    }
    release_n(bc, 2 * nt);
    release_n(ref, 2 * nt);
}

TD_TEST(test_broadcast_coalesced_dense_only, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_tensor *t[NT];
    dense_tensors(t);
    check_broadcast_coalesced(t, NT, 100); /* numel 5 * 8 bytes * 5 / 2 */
    check_broadcast_coalesced(t, NT, 0);   /* the 10 MiB default: one bucket per dtype */
    /* every tensor must be on devices[0] */
    td_tensor *moved = dev_to(t[2], dev(1)), *mixed[NT];
    memcpy(mixed, t, sizeof mixed);
    mixed[2] = moved;
    td_device devs[2] = {dev(0), dev(1)};
    td_tensor *out[2 * NT];
    TD_CHECK_ERR(td_comm_broadcast_coalesced(mixed, NT, devs, 2, 100, out), TD_ERR_INVALID,
                 "All tensors must be on devices[0]: 0");
    td_tensor_release(moved);
    release_n(t, NT);
    dev_finish();
}

TD_TEST(test_broadcast_coalesced_empty_tensors, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_tensor *t[3], *h[3];
    h[0] = dev_host_arange(TD_UINT8, TD_SHAPE(0), 1.0);
    h[1] = dev_host_arange(TD_FLOAT32, TD_SHAPE(5), 1.5);
    h[2] = dev_host_arange(TD_FLOAT64, TD_SHAPE(5), 2.5);
    for (int i = 0; i < 3; i++)
        t[i] = dev_to(h[i], dev(0));
    check_broadcast_coalesced(t, 3, 256);
    release_n(t, 3);
    release_n(h, 3);
    dev_finish();
}

/* test_reduce_add: x on device 0, y on device `other` (device 0 too with one device). */
static void reduce_add_case(td_test_ctx *ctx, int need)
{
    dev_setup(ctx, need);
    td_device other = dev(need - 1);
    td_tensor *hx = dev_host_arange(TD_FLOAT32, TD_SHAPE(5, 5), 1.0);
    td_tensor *hy = dev_host_arange(TD_FLOAT32, TD_SHAPE(5, 5), -0.5);
    td_tensor *x = dev_to(hx, dev(0)), *y = dev_to(hy, other);
    td_tensor *inputs[2] = {x, y}, *result = NULL, *expected = NULL;
    TD_CHECK_OK(td_comm_reduce_add(inputs, 2, dev_current(), &result));
    TD_CHECK(td_device_equal(td_tensor_device(result), dev(0)));
    TD_CHECK_OK(td_tensor_add(hx, hy, &expected));
    TD_CHECK(td_tensor_equal(result, expected));
    TD_CHECK(result != x);
    td_tensor_release(result);
    /* onto other, and a single input as is */
    TD_CHECK_OK(td_comm_reduce_add(inputs, 2, other, &result));
    TD_CHECK(td_device_equal(td_tensor_device(result), other));
    TD_CHECK(td_tensor_equal(result, expected));
    td_tensor_release(result);
    TD_CHECK_OK(td_comm_reduce_add(inputs, 1, dev(0), &result));
    TD_CHECK(result == x);
    td_tensor_release(result);
    /* the three messages */
    td_tensor *with_cpu[2] = {x, hy};
    TD_CHECK_ERR(td_comm_reduce_add(with_cpu, 2, dev(0), &result), TD_ERR_INVALID,
                 "reduce_add expects all inputs to be on GPUs");
    td_tensor *unsq = NULL;
    TD_CHECK_OK(td_tensor_unsqueeze(y, 0, &unsq));
    td_tensor *bad_size[2] = {x, unsq};
    TD_CHECK_ERR(td_comm_reduce_add(bad_size, 2, dev(0), &result), TD_ERR_INVALID,
                 "input 1 has invalid size: got 1x5x5, but expected 5x5");
    td_tensor *both0[2] = {x, x};
    if (other.index != 0)
        TD_CHECK_ERR(td_comm_reduce_add(both0, 2, other, &result), TD_ERR_INVALID,
                     "reduce_add expects destination to be on the same GPU with one of the tensors");
    td_tensor *all[] = {hx, hy, x, y, expected, unsq};
    release_n(all, 6);
    dev_finish();
}

TD_TEST(test_reduce_add, DEV_CASE) { reduce_add_case(ctx, 2); }
TD_TEST(test_reduce_add_one_device, DEV_CASE) { reduce_add_case(ctx, 1); }

TD_TEST(test_reduce_add_coalesced_dense_only, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_tensor *inputs[2 * NT];
    dense_tensors(inputs);
    for (int i = 0; i < NT; i++)
        inputs[NT + i] = dev_to(inputs[i], dev(1));
    td_tensor *rc[NT];
    TD_CHECK_OK(td_comm_reduce_add_coalesced(inputs, 2, NT, dev(0), 100, rc));
    for (int i = 0; i < NT; i++) {
        td_tensor *pair[2] = {inputs[i], inputs[NT + i]}, *r = NULL;
        TD_CHECK_OK(td_comm_reduce_add(pair, 2, dev(0), &r));
        td_tensor *h = dev_to(inputs[i], cpu), *twice = NULL;
        TD_CHECK_OK(td_tensor_add(h, h, &twice));
        TD_CHECK(td_tensor_equal(r, twice));
        TD_CHECK(td_tensor_equal(rc[i], r));
        TD_CHECK_EQ(td_tensor_dtype(rc[i]), td_tensor_dtype(inputs[i]));
        TD_CHECK(td_device_equal(td_tensor_device(rc[i]), dev(0)));
        td_tensor_release(twice);
        td_tensor_release(h);
        td_tensor_release(r);
    }
    for (int i = 0; i < NT; i++) {
        uint64_t before[NT];
        for (int k = 0; k < NT; k++)
            before[k] = td_tensor_version(rc[k]);
        TD_CHECK_OK(td_tensor_fill(rc[i], 0.0));
        for (int k = 0; k < NT; k++)
            TD_CHECK_EQ(td_tensor_version(rc[k]), before[k] + (k == i));
    }
    release_n(rc, NT);
    release_n(inputs, 2 * NT);
    dev_finish();
}

/* ---- scatter ------------------------------------------------------------------------------ */

/* _test_scatter: input on the host or device 0, chunks along dim onto devices 0 and `other`. */
static void check_scatter(td_tensor *input, const int64_t *chunk_sizes, int dim, td_device other)
{
    int wrapped = dim < 0 ? dim + td_tensor_ndim(input) : dim;
    int64_t ref[2];
    for (int i = 0; i < 2; i++)
        ref[i] = chunk_sizes ? chunk_sizes[i] : td_tensor_size(input, wrapped) / 2;
    td_device devs[2] = {dev(0), other};
    td_tensor *result[2] = {NULL, NULL};
    int n = 0;
    TD_CHECK_OK(td_comm_scatter(input, devs, 2, chunk_sizes, chunk_sizes ? 2 : 0, dim, NULL, result, &n));
    TD_CHECK_EQ(n, 2);
    int64_t start = 0;
    for (int i = 0; i < 2; i++) {
        td_tensor *expected = NULL;
        TD_CHECK_OK(td_tensor_narrow(input, wrapped, start, ref[i], &expected));
        TD_CHECK(td_tensor_equal(result[i], expected));
        TD_CHECK(td_device_equal(td_tensor_device(result[i]), devs[i]));
        if (td_device_equal(td_tensor_device(result[i]), td_tensor_device(input)))
            TD_CHECK(td_tensor_data(result[i]) == td_tensor_data(input)); /* a view, no copy */
        start += ref[i];
        td_tensor_release(expected);
    }
    /* out= */
    td_tensor *out[2];
    for (int i = 0; i < 2; i++)
        TD_CHECK_OK(td_tensor_empty_on(devs[i], td_tensor_dtype(input), td_tensor_shape(result[i]), NULL, &out[i]));
    TD_CHECK_OK(td_comm_scatter_out(input, out, 2, dim, NULL));
    for (int i = 0; i < 2; i++)
        TD_CHECK(td_tensor_equal(out[i], result[i]));

    /* messages */
    char want[256];
    if (chunk_sizes) {
        td_device three[3] = {dev(0), dev(0), dev(0)};
        td_tensor *r3[3];
        TD_CHECK_ERR(td_comm_scatter(input, three, 3, chunk_sizes, 2, dim, NULL, r3, &n), TD_ERR_INVALID,
                     "Expected devices and chunk_sizes to be of same length, but got len(devices) = 3 and "
                     "len(chunk_sizes) = 2");
    }
    TD_CHECK_ERR(td_comm_scatter(input, devs, 0, NULL, 0, dim, NULL, result, &n), TD_ERR_INVALID,
                 "Expected at least one device to scatter to");
    TD_CHECK_ERR(td_comm_scatter_out(input, out, 0, dim, NULL), TD_ERR_INVALID,
                 "Expected at least one output tensor to scatter to");
    td_tensor *on_cpu = dev_to(out[0], cpu);
    td_tensor *bad[2] = {on_cpu, out[1]};
    TD_CHECK_ERR(td_comm_scatter_out(input, bad, 2, dim, NULL), TD_ERR_INVALID,
                 "Expected all output tensors to be CUDA tensors, but output tensor at index 0 has device 'cpu'");
    td_tensor *unsq = NULL;
    TD_CHECK_OK(td_tensor_unsqueeze(out[0], 0, &unsq));
    bad[0] = unsq;
    char s0[64], s1[64];
    const int64_t *os = td_tensor_sizes(out[0]), *is = td_tensor_sizes(input);
    snprintf(s0, sizeof s0, "[1, %lld, %lld]", (long long)os[0], (long long)os[1]);
    snprintf(s1, sizeof s1, "[%lld, %lld]", (long long)is[0], (long long)is[1]);
    snprintf(want, sizeof want,
             "Output tensor at index 0 has incorrect shape: %s. Expected same shape except for scatter dim %d as the "
             "source tensor: %s.",
             s0, wrapped, s1);
    TD_CHECK_ERR(td_comm_scatter_out(input, bad, 2, dim, NULL), TD_ERR_INVALID, want);
    td_tensor *short0 = NULL;
    TD_CHECK_OK(td_tensor_narrow(out[0], wrapped, 1, td_tensor_size(out[0], wrapped) - 1, &short0));
    bad[0] = short0;
    snprintf(want, sizeof want,
             "Total size for output tensors along scatter dim %d does not match the source tensor size at dim %d. "
             "Expected %lld, but got total size %lld",
             wrapped, wrapped, (long long)td_tensor_size(input, wrapped),
             (long long)td_tensor_size(input, wrapped) - 1);
    TD_CHECK_ERR(td_comm_scatter_out(input, bad, 2, dim, NULL), TD_ERR_INVALID, want);
    td_tensor_release(short0);
    td_tensor_release(unsq);
    td_tensor_release(on_cpu);
    release_n(out, 2);
    release_n(result, 2);
}

/* need 1: both chunks onto device 0, from the host only (from device 0 the second chunk would be a
 * view at an offset, which the same-device check does not expect). */
static void scatter_case(td_test_ctx *ctx, int need, bool gpu, int64_t rows, const int64_t *chunk_sizes, int dim)
{
    dev_setup(ctx, need);
    td_tensor *host = dev_host_arange(TD_FLOAT32, TD_SHAPE(rows, 4), 0.5);
    td_tensor *input = gpu ? dev_to(host, dev(0)) : td_tensor_retain(host);
    check_scatter(input, chunk_sizes, dim, dev(need - 1));
    td_tensor_release(input);
    td_tensor_release(host);
    dev_finish();
}

static const int64_t sizes_2_4[2] = {2, 4};

TD_TEST(test_scatter_cpu, DEV_CASE) { scatter_case(ctx, 2, false, 4, NULL, 0); }
TD_TEST(test_scatter_cpu_dim, DEV_CASE) { scatter_case(ctx, 2, false, 4, NULL, 1); }
TD_TEST(test_scatter_cpu_neg_dim, DEV_CASE) { scatter_case(ctx, 2, false, 4, NULL, -2); }
TD_TEST(test_scatter_cpu_sizes, DEV_CASE) { scatter_case(ctx, 2, false, 6, sizes_2_4, 0); }
TD_TEST(test_scatter_gpu, DEV_CASE) { scatter_case(ctx, 2, true, 4, NULL, 0); }
TD_TEST(test_scatter_gpu_dim, DEV_CASE) { scatter_case(ctx, 2, true, 4, NULL, 1); }
TD_TEST(test_scatter_gpu_neg_dim, DEV_CASE) { scatter_case(ctx, 2, true, 4, NULL, -2); }
TD_TEST(test_scatter_gpu_sizes, DEV_CASE) { scatter_case(ctx, 2, true, 6, sizes_2_4, 0); }
TD_TEST(test_scatter_cpu_one_device, DEV_CASE) { scatter_case(ctx, 1, false, 4, NULL, 0); }
TD_TEST(test_scatter_cpu_sizes_one_device, DEV_CASE) { scatter_case(ctx, 1, false, 6, sizes_2_4, 0); }

/* streams: a chunk copied on the given stream of its device; a stream of another device fails */
TD_TEST(test_scatter_streams, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_tensor *host = dev_host_arange(TD_FLOAT32, TD_SHAPE(4, 4), 1.0);
    td_stream *s1 = NULL, *s0 = NULL;
    TD_CHECK_OK(td_stream_create(dev(1), 0, &s1));
    TD_CHECK_OK(td_stream_create(dev(0), 0, &s0));
    td_device devs[2] = {dev(0), dev(1)};
    td_stream *streams[2] = {NULL, s1};
    td_tensor *result[2];
    int n = 0;
    TD_CHECK_OK(td_comm_scatter(host, devs, 2, NULL, 0, 0, streams, result, &n));
    TD_CHECK_OK(td_stream_synchronize(s1));
    td_tensor *expected = NULL;
    TD_CHECK_OK(td_tensor_narrow(host, 0, 2, 2, &expected));
    TD_CHECK(td_tensor_equal(result[1], expected));
    td_stream *wrong[2] = {NULL, s0};
    td_tensor *never[2];
    TD_CHECK_ERR(td_comm_scatter(host, devs, 2, NULL, 0, 0, wrong, never, &n), TD_ERR_INVALID,
                 "Expected the device associated with the stream at index 1 (was 0) to match the device supplied at "
                 "that index (expected 1)");
    td_tensor_release(expected);
    release_n(result, 2);
    td_stream_release(s0);
    td_stream_release(s1);
    td_tensor_release(host);
    dev_finish();
}

/* ---- gather ------------------------------------------------------------------------------- */

/* x on device 0 and y on device `other` (device 0 too with one device), gathered onto the current
 * device (other, inside a guard), device 0, the host and device 2 where there is one. */
static void check_gather(td_test_ctx *ctx, int need, int dim)
{
    dev_setup(ctx, need);
    td_device other = dev(need - 1);
    td_tensor *hx = dev_host_arange(TD_FLOAT32, TD_SHAPE(2, 5), 1.0);
    td_tensor *hy = dev_host_arange(TD_FLOAT32, TD_SHAPE(2, 5), -2.0);
    td_tensor *x = dev_to(hx, dev(0)), *y = dev_to(hy, other);
    int wrapped = dim < 0 ? dim + 2 : dim;
    int64_t expected[2] = {2, 5};
    expected[wrapped] *= 2;
    td_device dests[4] = {dev_current(), dev(0), cpu, dev(2)};
    int ndest = td_device_count(dev(0).type) > 2 ? 4 : 3;
    td_tensor *inputs[2] = {x, y};
    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, other));
    for (int k = 0; k < ndest; k++) {
        td_device want = k == 0 ? other : dests[k]; /* None: the current device, not x's */
        for (int use_out = 0; use_out < 2; use_out++) {
            td_tensor *result = NULL;
            if (use_out) {
                td_tensor *out = NULL;
                TD_CHECK_OK(td_tensor_empty_on(want, TD_FLOAT32, TD_SHAPE(expected[0], expected[1]), NULL, &out));
                TD_CHECK_OK(td_comm_gather_out(inputs, 2, dim, out));
                result = out;
            } else {
                TD_CHECK_OK(td_comm_gather(inputs, 2, dim, dests[k], &result));
            }
            TD_CHECK(td_device_equal(td_tensor_device(result), want));
            TD_CHECK_EQ(td_tensor_size(result, 0), expected[0]);
            TD_CHECK_EQ(td_tensor_size(result, 1), expected[1]);
            td_tensor *part = NULL;
            int64_t len = td_tensor_size(x, wrapped);
            TD_CHECK_OK(td_tensor_narrow(result, wrapped, 0, len, &part));
            TD_CHECK(td_tensor_equal(part, hx));
            td_tensor_release(part);
            TD_CHECK_OK(td_tensor_narrow(result, wrapped, len, len, &part));
            TD_CHECK(td_tensor_equal(part, hy));
            td_tensor_release(part);
            td_tensor_release(result);
        }
    }
    td_device_guard_exit(&g);
    /* messages */
    td_tensor *r = NULL;
    TD_CHECK_ERR(td_comm_gather(inputs, 0, dim, dev_current(), &r), TD_ERR_INVALID,
                 "Expected at least one tensor to gather from");
    td_tensor *with_cpu[2] = {hx, y};
    TD_CHECK_ERR(td_comm_gather(with_cpu, 2, dim, dev_current(), &r), TD_ERR_INVALID,
                 "Expected all input tensors to be CUDA tensors, but tensor at index 0 has device cpu");
    td_tensor *unsq = NULL;
    TD_CHECK_OK(td_tensor_unsqueeze(y, 0, &unsq));
    td_tensor *bad_ndim[2] = {x, unsq};
    TD_CHECK_ERR(td_comm_gather(bad_ndim, 2, dim, dev_current(), &r), TD_ERR_INVALID,
                 "Expected all input tensors to have the same number of dimensions, but tensor at index 1has 3 "
                 "dimensions, (expected 2)");
    td_tensor *cut = NULL;
    TD_CHECK_OK(td_tensor_narrow(y, wrapped == 0 ? 1 : 0, 1, wrapped == 0 ? 4 : 1, &cut));
    td_tensor *bad_shape[2] = {x, cut};
    TD_CHECK_ERR(td_comm_gather(bad_shape, 2, dim, dev_current(), &r), TD_ERR_INVALID,
                 wrapped == 0 ? "Input tensor at index 1 has invalid shape [2, 4], but expected [2, 5]"
                              : "Input tensor at index 1 has invalid shape [1, 5], but expected [2, 5]");
    td_tensor *wrong_out = NULL;
    TD_CHECK_OK(td_tensor_empty_on(dev(0), TD_FLOAT32, TD_SHAPE(3, 3), NULL, &wrong_out));
    TD_CHECK_ERR(td_comm_gather_out(inputs, 2, dim, wrong_out), TD_ERR_INVALID, "Expected out tensor to have shape");
    td_tensor *all[] = {hx, hy, x, y, unsq, cut, wrong_out};
    release_n(all, 7);
    dev_finish();
}

TD_TEST(test_gather, DEV_CASE) { check_gather(ctx, 2, 0); }
TD_TEST(test_gather_dim, DEV_CASE) { check_gather(ctx, 2, 1); }
TD_TEST(test_gather_neg_dim, DEV_CASE) { check_gather(ctx, 2, -1); }
TD_TEST(test_gather_one_device, DEV_CASE) { check_gather(ctx, 1, 0); }
TD_TEST(test_gather_dim_one_device, DEV_CASE) { check_gather(ctx, 1, 1); }

/* ---- memory formats ----------------------------------------------------------------------- */

static bool channels_last_contiguous(const td_tensor *t)
{
    const int64_t *s = td_tensor_sizes(t), *st = td_tensor_strides(t);
    return st[1] == 1 && st[3] == s[1] && st[2] == s[1] * s[3] && st[0] == s[1] * s[2] * s[3];
}

TD_TEST(test_memory_format_scatter_gather, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_tensor *nhwc_data = dev_host_arange(TD_FLOAT32, TD_SHAPE(10, 32, 32, 3), 0.001);
    td_tensor *nhwc = NULL;
    const int perm[4] = {0, 3, 1, 2};
    TD_CHECK_OK(td_tensor_permute(nhwc_data, perm, 4, &nhwc)); /* (10, 3, 32, 32), channels_last */
    TD_CHECK(channels_last_contiguous(nhwc));
    td_device devs[2] = {dev(0), dev(1)};
    td_tensor *results[2];
    int n = 0;
    TD_CHECK_OK(td_comm_scatter(nhwc, devs, 2, NULL, 0, 0, NULL, results, &n));
    TD_CHECK_EQ(n, 2);
    for (int i = 0; i < 2; i++) {
        TD_CHECK_EQ(td_tensor_size(results[i], 0), 5);
        TD_CHECK(!td_tensor_is_contiguous(results[i]));
        TD_CHECK(channels_last_contiguous(results[i]));
        TD_CHECK_EQ(td_tensor_stride(results[i], 2), 96);
    }
    td_tensor *gathered = NULL;
    TD_CHECK_OK(td_comm_gather(results, 2, 0, dev_current(), &gathered));
    TD_CHECK(td_device_equal(td_tensor_device(gathered), dev(0)));
    TD_CHECK(channels_last_contiguous(gathered));
    TD_CHECK(!td_tensor_is_contiguous(gathered));
    TD_CHECK(td_tensor_equal(gathered, nhwc));
    /* one input without the format: a contiguous result */
    td_tensor *plain = NULL, *mixed_out = NULL;
    TD_CHECK_OK(td_tensor_clone(results[1], &plain));
    TD_CHECK(td_tensor_is_contiguous(plain));
    td_tensor *mixed[2] = {results[0], plain};
    TD_CHECK_OK(td_comm_gather(mixed, 2, 0, dev_current(), &mixed_out));
    TD_CHECK(td_tensor_is_contiguous(mixed_out));
    TD_CHECK(td_tensor_equal(mixed_out, nhwc));
    td_tensor *all[] = {nhwc_data, nhwc, results[0], results[1], gathered, plain, mixed_out};
    release_n(all, 7);
    dev_finish();
}

TD_TEST_MAIN()
