/* The comm primitives (spec/cuda_multigpu.md section 9), named after the test_cuda_multigpu.py
 * tests they port: broadcast (cpu and device sources, the out form and its messages), the
 * coalesced broadcast and reduce_add over dense tensors (sparse tensors do not exist in tdist),
 * reduce_add, scatter and gather along every dim the seed uses with every [T] message of
 * Appendix A, and channels_last kept through scatter and gather. The Python-only keyword messages
 * ("Exactly one of 'devices' and 'out'", "'devices' must not be specified", "'destination' must not
 * be specified") cannot happen: the keyword forms are separate functions. Broadcast, reduce_add,
 * scatter from the host and gather also run as *_one_device cases with device 0 in the second
 * device's place, which one GPU runs. test_scatter_namedtuple and test_gather_namedtuple port
 * nn.parallel.scatter_gather over td_values (records are the namedtuples; Python's two namedtuple
 * flavours are two tags), with the other branches of its recursion (tuples, lists, dicts,
 * replicated leaves, zip truncation, 0-dim gathers) and its messages beside them. */
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

/* ---- container-aware scatter and gather (torch.nn.parallel.scatter_gather) ----------------- */

/* A td_value holding a tensor, taking the caller's reference to t. */
static td_value *tv(td_tensor *t)
{
    td_value *v = td_value_tensor(t);
    td_tensor_release(t);
    return v;
}

/* The tensor of a value (borrowed), failing the test when it is something else. */
static td_tensor *tensor_of(const td_value *v)
{
    TD_CHECK(v && td_value_kind_of(v) == TD_VAL_TENSOR);
    return td_value_get_tensor(v);
}

/* t[start : start + len] along dim 0 of a host tensor, as a new contiguous host tensor. */
static td_tensor *host_rows(td_tensor *t, int64_t start, int64_t len)
{
    td_tensor *part = NULL, *copy = NULL;
    TD_CHECK_OK(td_tensor_narrow(t, 0, start, len, &part));
    TD_CHECK_OK(td_tensor_clone(part, &copy));
    td_tensor_release(part);
    return copy;
}

/* test_scatter_namedtuple: records (tag, fields a and b) of num_devices * 2 elements on device 0
 * scatter into one record of the same tag per device, element i holding a[2i:2i+2] on device i.
 * Python's two namedtuple flavours (collections.namedtuple, typing.NamedTuple) are two tags. */
TD_TEST(test_scatter_namedtuple, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 2);
    int ndev = td_device_count(type);
    td_device devs[8];
    for (int i = 0; i < ndev && i < 8; i++)
        devs[i] = dev(i);
    if (ndev > 8)
        ndev = 8;
    for (uint32_t tag = TD_REC_USER; tag < TD_REC_USER + 2; tag++) {
        td_tensor *ha = dev_host_arange(TD_FLOAT32, TD_SHAPE(ndev * 2), 0.5);
        td_tensor *hb = dev_host_arange(TD_FLOAT32, TD_SHAPE(ndev * 2), -3.0);
        td_value *inp = td_value_record_of(tag, 2, tv(dev_to(ha, dev(0))), tv(dev_to(hb, dev(0))));
        td_value *out[8];
        int n = 0;
        TD_CHECK_OK(td_comm_scatter_value(inp, devs, ndev, 0, out, &n));
        TD_CHECK_EQ(n, ndev);
        for (int i = 0; i < n; i++) {
            TD_CHECK_EQ(td_value_kind_of(out[i]), TD_VAL_RECORD);
            TD_CHECK_EQ(td_value_record_tag(out[i]), tag);
            TD_CHECK_EQ(td_value_len(out[i]), 2);
            td_tensor *a = tensor_of(td_value_at(out[i], 0)), *b = tensor_of(td_value_at(out[i], 1));
            TD_CHECK(td_device_equal(td_tensor_device(a), dev(i)));
            TD_CHECK(td_device_equal(td_tensor_device(b), dev(i)));
            td_tensor *ea = host_rows(ha, 2 * i, 2), *eb = host_rows(hb, 2 * i, 2);
            TD_CHECK(td_tensor_equal(a, ea));
            TD_CHECK(td_tensor_equal(b, eb));
            td_tensor_release(ea);
            td_tensor_release(eb);
            td_value_release(out[i]);
        }
        td_value_release(inp);
        td_tensor_release(ha);
        td_tensor_release(hb);
    }
    dev_finish();
}

/* test_gather_namedtuple: outputs [R(a on 0, b on 1), R(a on 1, b on 0)] gather to the host and to
 * device 0 as one record of the same tag whose field i is cat(outputs[0][i], outputs[1][i]). */
TD_TEST(test_gather_namedtuple, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 2);
    int ndev = td_device_count(type);
    for (uint32_t tag = TD_REC_USER; tag < TD_REC_USER + 2; tag++) {
        td_tensor *h[4];
        for (int k = 0; k < 4; k++)
            h[k] = dev_host_arange(TD_FLOAT32, TD_SHAPE(ndev * 2), (double)(k + 1) * (tag == TD_REC_USER ? 1 : -1));
        td_value *out1 = td_value_record_of(tag, 2, tv(dev_to(h[0], dev(0))), tv(dev_to(h[1], dev(1))));
        td_value *out2 = td_value_record_of(tag, 2, tv(dev_to(h[2], dev(1))), tv(dev_to(h[3], dev(0))));
        const td_value *outputs[2] = {out1, out2};
        td_device targets[2] = {cpu, dev(0)};
        for (int k = 0; k < 2; k++) {
            if (tag != TD_REC_USER && k == 0)
                continue; /* the typing.NamedTuple half gathers to device 0 only, as upstream */
            td_value *g = NULL;
            TD_CHECK_OK(td_comm_gather_value(outputs, 2, 0, targets[k], &g));
            TD_CHECK_EQ(td_value_kind_of(g), TD_VAL_RECORD);
            TD_CHECK_EQ(td_value_record_tag(g), tag);
            TD_CHECK_EQ(td_value_len(g), 2);
            for (int i = 0; i < 2; i++) {
                td_tensor *x = tensor_of(td_value_at(g, (size_t)i)), *cat = NULL;
                const td_tensor *parts[2] = {h[i], h[2 + i]};
                TD_CHECK_OK(td_tensor_cat(parts, 2, 0, &cat));
                TD_CHECK(td_device_equal(td_tensor_device(x), targets[k]));
                TD_CHECK(td_tensor_equal(x, cat));
                td_tensor_release(cat);
            }
            td_value_release(g);
        }
        td_value_release(out1);
        td_value_release(out2);
        release_n(h, 4);
    }
    dev_finish();
}

/* The other branches of upstream's recursion: a tuple gives one tuple per device, a list one list,
 * a dict one dict (a non-tensor key shared), anything else (None, numbers, strings, empty
 * containers) the same object on every device; gather rebuilds tuples, lists and dicts. */
TD_TEST(test_scatter_gather_containers, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_device devs[2] = {dev(0), dev(1)};
    td_tensor *h1 = dev_host_arange(TD_FLOAT32, TD_SHAPE(4, 2), 1.0), *h2 = dev_host_arange(TD_INT64, TD_SHAPE(2, 3), 2.0);
    td_tensor *h3 = dev_host_arange(TD_FLOAT64, TD_SHAPE(6), 0.25);
    td_value *empty = td_value_list_new(), *seven = td_value_int(7), *dict = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(dict, "x", tv(dev_to(h2, dev(0)))));
    TD_CHECK_OK(td_value_dict_set(dict, td_value_int(3), td_value_none()));
    td_value *v = td_value_list_new();
    TD_CHECK_OK(td_value_list_append(v, td_value_tuple_of(3, tv(dev_to(h1, dev(1))), td_value_retain(seven),
                                                          td_value_string("s"))));
    TD_CHECK_OK(td_value_list_append(v, td_value_retain(dict)));
    TD_CHECK_OK(td_value_list_append(v, td_value_retain(empty)));
    TD_CHECK_OK(td_value_list_append(v, td_value_tensor(h3))); /* a host tensor scatters too */
    TD_CHECK_OK(td_value_list_append(v, td_value_double(2.5)));
    td_value *out[2];
    int n = 0;
    TD_CHECK_OK(td_comm_scatter_value(v, devs, 2, 0, out, &n));
    TD_CHECK_EQ(n, 2);
    for (int i = 0; i < 2; i++) {
        const td_value *o = out[i];
        TD_CHECK_EQ(td_value_kind_of(o), TD_VAL_LIST);
        TD_CHECK_EQ(td_value_len(o), 5);
        const td_value *tup = td_value_at(o, 0);
        TD_CHECK_EQ(td_value_kind_of(tup), TD_VAL_TUPLE);
        TD_CHECK_EQ(td_value_len(tup), 3);
        td_tensor *c1 = tensor_of(td_value_at(tup, 0)), *e1 = host_rows(h1, 2 * i, 2);
        TD_CHECK(td_device_equal(td_tensor_device(c1), dev(i)));
        TD_CHECK(td_tensor_equal(c1, e1));
        td_tensor_release(e1);
        TD_CHECK(td_value_at(tup, 1) == seven); /* replicated: the same object */
        TD_CHECK(strcmp(td_value_get_string(td_value_at(tup, 2), NULL), "s") == 0);
        const td_value *d = td_value_at(o, 1);
        TD_CHECK_EQ(td_value_kind_of(d), TD_VAL_DICT);
        TD_CHECK_EQ(td_value_len(d), 2);
        TD_CHECK(td_value_dict_key_at(d, 0) == td_value_dict_key_at(dict, 0)); /* the key "x", shared */
        td_tensor *c2 = tensor_of(td_value_dict_get_str(d, "x")), *e2 = host_rows(h2, i, 1);
        TD_CHECK(td_device_equal(td_tensor_device(c2), dev(i)));
        TD_CHECK(td_tensor_equal(c2, e2));
        td_tensor_release(e2);
        TD_CHECK_EQ(td_value_kind_of(td_value_dict_value_at(d, 1)), TD_VAL_NONE);
        TD_CHECK(td_value_at(o, 2) == empty);
        td_tensor *c3 = tensor_of(td_value_at(o, 3)), *e3 = host_rows(h3, 3 * i, 3);
        TD_CHECK(td_device_equal(td_tensor_device(c3), dev(i)));
        TD_CHECK(td_tensor_equal(c3, e3));
        td_tensor_release(e3);
        TD_CHECK(td_value_get_double(td_value_at(o, 4)) == 2.5);
    }
    /* gather back what gathers: [(t1, None), {"x": t2}] from each device's pieces */
    td_value *parts[2];
    for (int i = 0; i < 2; i++) {
        const td_value *tup = td_value_at(out[i], 0), *d = td_value_at(out[i], 1);
        td_value *pd = td_value_dict_new();
        TD_CHECK_OK(td_value_dict_set_str(pd, "x", td_value_retain(td_value_dict_get_str(d, "x"))));
        parts[i] = td_value_list_new();
        TD_CHECK_OK(td_value_list_append(parts[i], td_value_tuple_of(2, td_value_retain(td_value_at(tup, 0)),
                                                                      td_value_none())));
        TD_CHECK_OK(td_value_list_append(parts[i], pd));
    }
    td_value *g = NULL;
    const td_value *const *gin = (const td_value *const *)parts;
    TD_CHECK_OK(td_comm_gather_value(gin, 2, 0, cpu, &g));
    td_value *expected = td_value_list_new();
    td_value *ed = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(ed, "x", td_value_tensor(h2)));
    TD_CHECK_OK(td_value_list_append(expected, td_value_tuple_of(2, td_value_tensor(h1), td_value_none())));
    TD_CHECK_OK(td_value_list_append(expected, ed));
    TD_CHECK_MSG(td_value_equal(g, expected), "gathered %s", td_value_format(g));
    TD_CHECK(td_device_equal(td_tensor_device(tensor_of(td_value_at(td_value_at(g, 0), 0))), cpu));
    td_value_release(g);
    /* onto the current device (index -1) inside a guard: device 1 */
    td_device_guard guard;
    TD_CHECK_OK(td_device_guard_enter(&guard, dev(1)));
    TD_CHECK_OK(td_comm_gather_value(gin, 2, 0, dev_current(), &g));
    td_device_guard_exit(&guard);
    TD_CHECK(td_value_equal(g, expected));
    TD_CHECK(td_device_equal(td_tensor_device(tensor_of(td_value_dict_get_str(td_value_at(g, 1), "x"))), dev(1)));
    td_value_release(g);
    td_value_release(expected);
    for (int i = 0; i < 2; i++) {
        td_value_release(parts[i]);
        td_value_release(out[i]);
    }
    td_value *values[] = {v, dict, empty, seven};
    for (int i = 0; i < 4; i++)
        td_value_release(values[i]);
    td_tensor *all[] = {h1, h2, h3};
    release_n(all, 3);
    dev_finish();
}

/* As upstream zips the pieces: a container gives as many values as its shortest member (a
 * 1-row tensor over 2 devices: one piece; an empty record: none), and gather over the shortest
 * list or tuple; scalars only replicate. */
TD_TEST(test_scatter_gather_value_shapes, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_device devs[2] = {dev(0), dev(1)};
    td_tensor *one_row = dev_host_arange(TD_FLOAT32, TD_SHAPE(1, 3), 1.0);
    td_value *v = td_value_tuple_of(2, td_value_tensor(one_row), td_value_int(5)), *out[2] = {NULL, NULL};
    int n = -1;
    TD_CHECK_OK(td_comm_scatter_value(v, devs, 2, 0, out, &n));
    TD_CHECK_EQ(n, 1);
    TD_CHECK_EQ(td_value_kind_of(out[0]), TD_VAL_TUPLE);
    TD_CHECK(td_device_equal(td_tensor_device(tensor_of(td_value_at(out[0], 0))), dev(0)));
    td_value_release(out[0]);
    td_value_release(v);
    v = td_value_record_new(TD_REC_USER, 0);
    TD_CHECK_OK(td_comm_scatter_value(v, devs, 2, 0, out, &n));
    TD_CHECK_EQ(n, 0);
    td_value_release(v);
    v = td_value_string("just a string");
    TD_CHECK_OK(td_comm_scatter_value(v, devs, 2, 0, out, &n));
    TD_CHECK_EQ(n, 2);
    TD_CHECK(out[0] == v && out[1] == v);
    td_value_release(out[0]);
    td_value_release(out[1]);
    td_value_release(v);
    /* dim 1 */
    td_tensor *wide = dev_host_arange(TD_FLOAT32, TD_SHAPE(2, 4), 1.0);
    v = td_value_tensor(wide);
    TD_CHECK_OK(td_comm_scatter_value(v, devs, 2, 1, out, &n));
    TD_CHECK_EQ(n, 2);
    TD_CHECK_EQ(td_tensor_size(tensor_of(out[1]), 1), 2);
    td_value *g = NULL;
    TD_CHECK_OK(td_comm_gather_value((const td_value *const *)out, 2, -1, cpu, &g));
    TD_CHECK(td_tensor_equal(tensor_of(g), wide));
    td_value_release(g);
    td_value_release(out[0]);
    td_value_release(out[1]);
    td_value_release(v);
    /* gather over lists of lengths 2 and 1: one element */
    td_tensor *h = dev_host_arange(TD_FLOAT32, TD_SHAPE(2), 1.0);
    td_value *l0 = td_value_list_new(), *l1 = td_value_list_new();
    TD_CHECK_OK(td_value_list_append(l0, tv(dev_to(h, dev(0)))));
    TD_CHECK_OK(td_value_list_append(l0, tv(dev_to(h, dev(0)))));
    TD_CHECK_OK(td_value_list_append(l1, tv(dev_to(h, dev(1)))));
    const td_value *lists[2] = {l0, l1};
    TD_CHECK_OK(td_comm_gather_value(lists, 2, 0, dev(0), &g));
    TD_CHECK_EQ(td_value_kind_of(g), TD_VAL_LIST);
    TD_CHECK_EQ(td_value_len(g), 1);
    TD_CHECK_EQ(td_tensor_size(tensor_of(td_value_at(g, 0)), 0), 4);
    td_value_release(g);
    /* 0-dim tensors along dim 0 become a vector */
    td_tensor *s0 = NULL, *s1 = NULL;
    TD_CHECK_OK(td_tensor_full_on(dev(0), TD_FLOAT32, TD_SHAPE_SCALAR, 1.5, &s0));
    TD_CHECK_OK(td_tensor_full_on(dev(1), TD_FLOAT32, TD_SHAPE_SCALAR, -2.0, &s1));
    td_value *sv[2] = {tv(s0), tv(s1)};
    TD_CHECK_OK(td_comm_gather_value((const td_value *const *)sv, 2, 0, cpu, &g));
    TD_CHECK_EQ(td_tensor_ndim(tensor_of(g)), 1);
    TD_CHECK_EQ(td_tensor_size(tensor_of(g), 0), 2);
    TD_CHECK_EQ(dev_get(tensor_of(g), 0), 1.5);
    TD_CHECK_EQ(dev_get(tensor_of(g), 1), -2.0);
    td_value_release(g);
    td_value *nones[2] = {td_value_none(), td_value_none()};
    TD_CHECK_OK(td_comm_gather_value((const td_value *const *)nones, 2, 0, cpu, &g));
    TD_CHECK_EQ(td_value_kind_of(g), TD_VAL_NONE);
    td_value_release(g);
    td_value *vals[] = {l0, l1, sv[0], sv[1], nones[0], nones[1]};
    for (int i = 0; i < 6; i++)
        td_value_release(vals[i]);
    td_tensor *all[] = {one_row, wide, h};
    release_n(all, 3);
    dev_finish();
}

TD_TEST(test_scatter_gather_value_errors, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_device devs[2] = {dev(0), dev(1)};
    td_tensor *h = dev_host_arange(TD_FLOAT32, TD_SHAPE(2), 1.0);
    td_value *v = td_value_tensor(h), *out[2], *g = NULL;
    int n = 0;
    TD_CHECK_ERR(td_comm_scatter_value(v, devs, 0, 0, out, &n), TD_ERR_INVALID, "Expected at least one device to scatter to");
    td_device negative[2] = {dev(0), dev(0)};
    negative[1].index = -1;
    td_value *five = td_value_int(5);
    TD_CHECK_ERR(td_comm_scatter_value(five, negative, 2, 0, out, &n), TD_ERR_INVALID,
                 "Expected non-negative device index, but got -1");
    td_value *scalar = NULL;
    {
        td_tensor *s = NULL;
        TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE_SCALAR, &s));
        scalar = tv(s);
    }
    TD_CHECK_ERR(td_comm_scatter_value(scalar, devs, 2, 0, out, &n), TD_ERR_INVALID,
                 "chunk expects at least a 1-dimensional tensor");
    /* gather */
    const td_value *host_pair[2] = {v, v};
    TD_CHECK_ERR(td_comm_gather_value(host_pair, 2, 0, cpu, &g), TD_ERR_INVALID,
                 "Gather function not implemented for CPU tensors");
    const td_value *ints[2] = {five, five};
    TD_CHECK_ERR(td_comm_gather_value(ints, 2, 0, cpu, &g), TD_ERR_INVALID, "cannot gather values of kind int");
    TD_CHECK_ERR(td_comm_gather_value(ints, 0, 0, cpu, &g), TD_ERR_INVALID, "expected at least one output");
    td_value *t0 = tv(dev_to(h, dev(0))), *t1 = tv(dev_to(h, dev(1)));
    const td_value *mixed[2] = {t0, five};
    TD_CHECK_ERR(td_comm_gather_value(mixed, 2, 0, cpu, &g), TD_ERR_INVALID, "different kinds");
    td_value *da = td_value_dict_new(), *db = td_value_dict_new(), *dc = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(da, "x", td_value_retain(t0)));
    TD_CHECK_OK(td_value_dict_set_str(db, "y", td_value_retain(t1)));
    TD_CHECK_OK(td_value_dict_set_str(dc, "x", td_value_retain(t1)));
    TD_CHECK_OK(td_value_dict_set_str(dc, "z", td_value_retain(t1)));
    const td_value *ab[2] = {da, db}, *ac[2] = {da, dc};
    TD_CHECK_ERR(td_comm_gather_value(ab, 2, 0, cpu, &g), TD_ERR_NOT_FOUND, "'x'");
    TD_CHECK_ERR(td_comm_gather_value(ac, 2, 0, cpu, &g), TD_ERR_INVALID, "All dicts must have the same number of keys");
    td_value *r1 = td_value_record_of(TD_REC_USER, 1, td_value_retain(t0));
    td_value *r2 = td_value_record_of(TD_REC_USER + 1, 1, td_value_retain(t1));
    const td_value *rr[2] = {r1, r2};
    TD_CHECK_ERR(td_comm_gather_value(rr, 2, 0, cpu, &g), TD_ERR_INVALID, "records of different tags");
    TD_CHECK(g == NULL);
    td_value *vals[] = {v, five, scalar, t0, t1, da, db, dc, r1, r2};
    for (int i = 0; i < 10; i++)
        td_value_release(vals[i]);
    td_tensor_release(h);
    dev_finish();
}

TD_TEST_MAIN()
