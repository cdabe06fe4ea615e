/* The comm primitives over device tensors (torch.cuda.comm): broadcast, broadcast_coalesced,
 * reduce_add, reduce_add_coalesced, scatter and gather, with PyTorch's messages in its validation
 * order (spec/cuda_multigpu.md section 9, Appendix A).
 *
 * Everything here is composed from device_tensor.c's copies, so each data movement follows the
 * copy contract (the destination's current stream waits for the copy). Python's keyword
 * combinations are separate functions, so its "Exactly one of 'devices' and 'out'" and "'devices'
 * must not be specified when 'out' is specified" cannot happen. Sparse tensors do not exist in
 * tdist: the coalesced functions bucket dense tensors only (PyTorch's sparse tuples and its
 * indices/values flattening have nothing to act on). The messages say "CUDA tensors" for any
 * accelerator, sim included: users search for PyTorch's words.
 *
 * Two things sit here because they are gather and scatter underneath: td_tensor_cat (torch.cat,
 * host and device alike: gather onto the inputs' own device with torch.cat's checks, dtype
 * promotion and its legacy skipping of 1-D empty tensors), and td_comm_scatter_value /
 * td_comm_gather_value, torch.nn.parallel.scatter_gather's recursion over td_value trees (records
 * are namedtuples) with scatter and gather at the tensor leaves. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/device.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "tensor/device_tensor.h"
#include "tensor/dtype.h"
#include "tensor/strided.h"

#define SIZES_BUF (TD_MAX_DIMS * 22 + 4)
/* Longest devices list (entries may repeat); the lists live on the stack. */
#define COMM_MAX_DEVICES 256
#define DEFAULT_BUFFER_SIZE ((size_t)10 * 1024 * 1024)

static const td_device cpu_device = {TD_DEVICE_CPU, -1};

static const char *sizes_str(char *buf, const td_tensor *t) { return tensor_format_sizes(buf, SIZES_BUF, t->ndim, t->sizes); }

/* "5x5", as reduce_add's message joins sizes. */
static const char *sizes_x(char *buf, const td_tensor *t)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < t->ndim && n < SIZES_BUF; i++)
        n += (size_t)snprintf(buf + n, SIZES_BUF - n, "%s%lld", i ? "x" : "", (long long)t->sizes[i]);
    return buf;
}

static void release_all(td_tensor **ts, int n)
{
    for (int i = 0; i < n; i++) {
        td_tensor_release(ts[i]);
        ts[i] = NULL;
    }
}

/* A device of a devices argument: an accelerator with an explicit, existing index. */
static td_status resolve_listed(td_device d, td_device *out)
{
    if (d.type != TD_DEVICE_CPU && d.index < 0)
        return error_fmt(TD_ERR_INVALID, "Expected non-negative device index, but got %d", d.index);
    return td_device_resolve(d, out);
}

/* A new tensor (version 0) on device holding t's values, copied with non_blocking. */
static td_status copy_to(const td_tensor *t, td_device device, const int64_t *strides, td_tensor **out)
{
    return tensor_copy_new(t, device, t->dtype, strides, true, out);
}

/* ---- broadcast ---------------------------------------------------------------------------- */

td_status td_comm_broadcast(td_tensor *src, const td_device *devices, int ndevices, td_tensor **out)
{
    if (!src || !out || (ndevices > 0 && !devices) || ndevices < 0)
        return error_fmt(TD_ERR_INVALID, "td_comm_broadcast: %s", !src ? "tensor is NULL" : "bad devices or out");
    td_device resolved[COMM_MAX_DEVICES];
    if (ndevices > COMM_MAX_DEVICES)
        return error_fmt(TD_ERR_INVALID, "td_comm_broadcast: at most %d devices, got %d", COMM_MAX_DEVICES, ndevices);
    for (int i = 0; i < ndevices; i++)
        TD_TRY(resolve_listed(devices[i], &resolved[i]));
    td_device home = td_tensor_device(src);
    for (int i = 0; i < ndevices; i++)
        out[i] = NULL;
    for (int i = 0; i < ndevices; i++) {
        if (td_device_equal(home, resolved[i])) {
            out[i] = td_tensor_retain(src);
            continue;
        }
        td_status st = copy_to(src, resolved[i], NULL, &out[i]);
        if (st != TD_OK) {
            release_all(out, i);
            return st;
        }
    }
    return TD_OK;
}

td_status td_comm_broadcast_out(td_tensor *src, td_tensor *const *outs, int nouts)
{
    if (!src || (nouts > 0 && !outs) || nouts < 0)
        return error_fmt(TD_ERR_INVALID, "td_comm_broadcast_out: %s", !src ? "tensor is NULL" : "bad outs");
    char b1[SIZES_BUF], b2[SIZES_BUF], dev[32];
    for (int i = 0; i < nouts; i++) {
        if (!outs[i])
            return error_fmt(TD_ERR_INVALID, "td_comm_broadcast_out: output tensor at index %d is NULL", i);
        if (tensor_is_host(outs[i]))
            return error_fmt(TD_ERR_INVALID,
                             "Expected all output tensors to be CUDA tensors, but output tensor at index %d has device "
                             "'%s'",
                             i, td_device_str(td_tensor_device(outs[i]), dev, sizeof dev));
        if (!strided_same_sizes(outs[i], src))
            return error_fmt(TD_ERR_INVALID,
                             "Expected all output tensors to have same shape as the source tensor %s, but output "
                             "tensor at index %d has shape %s",
                             sizes_str(b1, src), i, sizes_str(b2, outs[i]));
    }
    for (int i = 0; i < nouts; i++)
        TD_TRY(td_tensor_copy_ex(outs[i], src, true)); /* outs[i] == src does nothing */
    return TD_OK;
}

/* ---- coalescing: take_tensors, flatten, unflatten ----------------------------------------- */

/* One bucket of tensor indices of one dtype whose bytes together stay within the limit (a single
 * tensor larger than the limit gets a bucket of its own). */
typedef struct bucket {
    int *members;
    int count;
    size_t bytes;
    td_dtype dtype;
} bucket;

typedef struct bucket_list {
    bucket *items;
    int count;
} bucket_list;

static void buckets_free(bucket_list *l)
{
    for (int i = 0; i < l->count; i++)
        free(l->items[i].members);
    free(l->items);
    l->items = NULL;
    l->count = 0;
}

/* PyTorch's take_tensors: tensors in order, grouped by type; a type's open group is emitted when
 * the next tensor would take it past limit. Buckets come out in emission order; the caller puts
 * each result back at its input's index, which restores the order. */
static void take_tensors(td_tensor *const *tensors, int n, size_t limit, bucket_list *out)
{
    int open[TD_DTYPE_COUNT];
    for (int d = 0; d < TD_DTYPE_COUNT; d++)
        open[d] = -1;
    out->items = TD_NEW_ARRAY(bucket, (size_t)n + 1);
    out->count = 0;
    for (int i = 0; i < n; i++) {
        td_dtype dt = tensors[i]->dtype;
        size_t bytes = td_tensor_nbytes(tensors[i]);
        if (open[dt] >= 0 && out->items[open[dt]].bytes > 0 && out->items[open[dt]].bytes + bytes > limit)
            open[dt] = -1;
        if (open[dt] < 0) {
            open[dt] = out->count++;
            bucket *b = &out->items[open[dt]];
            b->members = TD_NEW_ARRAY(int, (size_t)n);
            b->dtype = dt;
        }
        bucket *b = &out->items[open[dt]];
        b->members[b->count++] = i;
        b->bytes += bytes;
    }
}

/* The tensors of a bucket (tensors[members[k]] + base) in one new 1-D tensor on device. */
static td_status flatten(td_tensor *const *tensors, const bucket *b, td_device device, td_tensor **out)
{
    int64_t total = 0;
    for (int k = 0; k < b->count; k++)
        total += td_tensor_numel(tensors[b->members[k]]);
    TD_TRY(td_tensor_empty_on(device, b->dtype, TD_SHAPE(total), NULL, out));
    int64_t offset = 0;
    td_status st = TD_OK;
    for (int k = 0; k < b->count && st == TD_OK; k++) {
        td_tensor *t = tensors[b->members[k]];
        int64_t n = td_tensor_numel(t);
        td_tensor *slice = tensor_new_view(*out, offset, t->ndim, t->sizes, NULL);
        st = td_tensor_copy_ex(slice, t, true);
        td_tensor_release(slice);
        offset += n;
    }
    if (st != TD_OK) {
        td_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

/* Each member's part of flat as a tensor that owns its storage (so each has its own version
 * counter, as the coalesced tests require), into out[members[k] * stride + column]. */
static td_status unflatten(td_tensor *flat, td_tensor *const *like, const bucket *b, td_tensor **out)
{
    int64_t offset = 0;
    for (int k = 0; k < b->count; k++) {
        const td_tensor *t = like[b->members[k]];
        td_tensor *slice = tensor_new_view(flat, flat->offset + offset, t->ndim, t->sizes, NULL);
        td_status st = copy_to(slice, td_tensor_device(flat), NULL, &out[b->members[k]]);
        td_tensor_release(slice);
        if (st != TD_OK)
            return st;
        offset += td_tensor_numel(t);
    }
    return TD_OK;
}

td_status td_comm_broadcast_coalesced(td_tensor *const *tensors, int ntensors, const td_device *devices,
                                      int ndevices, size_t buffer_size, td_tensor **out)
{
    if (!out || ntensors < 0 || ndevices < 0 || (ntensors > 0 && !tensors) || (ndevices > 0 && !devices))
        return error_fmt(TD_ERR_INVALID, "td_comm_broadcast_coalesced: bad tensors, devices or out");
    if (ndevices == 0)
        return error_fmt(TD_ERR_INVALID, "Expected at least one device to broadcast to");
    if (ndevices > COMM_MAX_DEVICES)
        return error_fmt(TD_ERR_INVALID, "td_comm_broadcast_coalesced: at most %d devices, got %d", COMM_MAX_DEVICES,
                         ndevices);
    td_device resolved[COMM_MAX_DEVICES];
    for (int d = 0; d < ndevices; d++)
        TD_TRY(resolve_listed(devices[d], &resolved[d]));
    for (int i = 0; i < ntensors; i++) {
        if (!tensors[i])
            return error_fmt(TD_ERR_INVALID, "td_comm_broadcast_coalesced: tensor %d is NULL", i);
        if (!td_device_equal(td_tensor_device(tensors[i]), resolved[0]))
            return error_fmt(TD_ERR_INVALID, "All tensors must be on devices[0]: %d", resolved[0].index);
    }
    if (buffer_size == 0)
        buffer_size = DEFAULT_BUFFER_SIZE;
    size_t total = (size_t)ndevices * (size_t)ntensors;
    for (size_t k = 0; k < total; k++)
        out[k] = NULL;
    for (int i = 0; i < ntensors; i++)
        out[i] = td_tensor_retain(tensors[i]); /* the devices[0] row is the inputs themselves */
    bucket_list buckets;
    take_tensors(tensors, ntensors, buffer_size, &buckets);
    td_status st = TD_OK;
    for (int g = 0; g < buckets.count && st == TD_OK; g++) {
        td_tensor *flat = NULL;
        st = flatten(tensors, &buckets.items[g], resolved[0], &flat);
        for (int d = 1; d < ndevices && st == TD_OK; d++) {
            td_tensor *copy = NULL;
            st = copy_to(flat, resolved[d], NULL, &copy);
            if (st == TD_OK)
                st = unflatten(copy, tensors, &buckets.items[g], out + (size_t)d * (size_t)ntensors);
            td_tensor_release(copy);
        }
        td_tensor_release(flat);
    }
    buckets_free(&buckets);
    if (st != TD_OK)
        release_all(out, (int)total);
    return st;
}

/* ---- reduce_add --------------------------------------------------------------------------- */

td_status td_comm_reduce_add(td_tensor *const *inputs, int ninputs, td_device destination, td_tensor **out)
{
    if (!out || ninputs < 0 || (ninputs > 0 && !inputs))
        return error_fmt(TD_ERR_INVALID, "td_comm_reduce_add: bad inputs or out");
    if (ninputs == 0)
        return error_fmt(TD_ERR_INVALID, "reduce_add expects at least one input");
    td_device dest;
    TD_TRY(td_device_resolve(destination, &dest));
    int root = -1;
    char b1[SIZES_BUF], b2[SIZES_BUF];
    for (int i = 0; i < ninputs; i++) {
        if (!inputs[i])
            return error_fmt(TD_ERR_INVALID, "td_comm_reduce_add: input %d is NULL", i);
        if (tensor_is_host(inputs[i]))
            return error_set_typed(TD_ERR_INVALID, "AssertionError", "reduce_add expects all inputs to be on GPUs");
        if (td_device_equal(td_tensor_device(inputs[i]), dest))
            root = i;
        if (!strided_same_sizes(inputs[i], inputs[0])) {
            char msg[2 * SIZES_BUF + 96];
            snprintf(msg, sizeof msg, "input %d has invalid size: got %s, but expected %s", i, sizes_x(b1, inputs[i]),
                     sizes_x(b2, inputs[0]));
            return error_set_typed(TD_ERR_INVALID, "ValueError", msg);
        }
    }
    if (root < 0)
        return error_fmt(TD_ERR_INVALID, "reduce_add expects destination to be on the same GPU with one of the tensors");
    if (ninputs == 1) {
        *out = td_tensor_retain(inputs[0]);
        return TD_OK;
    }
    td_tensor *result = NULL;
    td_status st = td_tensor_clone(inputs[root], &result); /* contiguous, on dest */
    for (int i = 0; i < ninputs && st == TD_OK; i++) {
        if (i == root)
            continue;
        td_tensor *moved = NULL;
        st = copy_to(inputs[i], dest, NULL, &moved);
        if (st == TD_OK)
            st = tensor_device_add_into(result, moved);
        td_tensor_release(moved);
    }
    if (st != TD_OK) {
        td_tensor_release(result);
        return st;
    }
    atomic_store(&result->storage->version, 0); /* a new tensor */
    *out = result;
    return TD_OK;
}

td_status td_comm_reduce_add_coalesced(td_tensor *const *inputs, int ndevices, int ntensors, td_device destination,
                                       size_t buffer_size, td_tensor **out)
{
    if (!out || ndevices < 0 || ntensors < 0 || (ndevices > 0 && ntensors > 0 && !inputs))
        return error_fmt(TD_ERR_INVALID, "td_comm_reduce_add_coalesced: bad inputs or out");
    if (ndevices == 0)
        return error_fmt(TD_ERR_INVALID, "reduce_add expects at least one input");
    if (ndevices > COMM_MAX_DEVICES)
        return error_fmt(TD_ERR_INVALID, "td_comm_reduce_add_coalesced: at most %d devices, got %d", COMM_MAX_DEVICES,
                         ndevices);
    td_device dest;
    TD_TRY(td_device_resolve(destination, &dest));
    char b1[SIZES_BUF], b2[SIZES_BUF];
    /* Every device's tensor i matches device 0's (the buckets are computed once from row 0). */
    for (int d = 0; d < ndevices; d++) {
        for (int i = 0; i < ntensors; i++) {
            const td_tensor *t = inputs[(size_t)d * (size_t)ntensors + (size_t)i], *first = inputs[i];
            if (!t)
                return error_fmt(TD_ERR_INVALID, "td_comm_reduce_add_coalesced: input %d of device %d is NULL", i, d);
            if (tensor_is_host(t))
                return error_set_typed(TD_ERR_INVALID, "AssertionError", "reduce_add expects all inputs to be on GPUs");
            if (!strided_same_sizes(t, first) || t->dtype != first->dtype) {
                char msg[2 * SIZES_BUF + 160];
                snprintf(msg, sizeof msg, "input %d has invalid size: got %s (%s), but expected %s (%s) for tensor %d", d,
                         sizes_x(b1, t), td_dtype_name(t->dtype), sizes_x(b2, first), td_dtype_name(first->dtype), i);
                return error_set_typed(TD_ERR_INVALID, "ValueError", msg);
            }
        }
    }
    if (buffer_size == 0)
        buffer_size = DEFAULT_BUFFER_SIZE;
    for (int i = 0; i < ntensors; i++)
        out[i] = NULL;
    bucket_list buckets;
    take_tensors(inputs, ntensors, buffer_size, &buckets);
    td_tensor **flats = TD_NEW_ARRAY(td_tensor *, (size_t)ndevices);
    td_status st = TD_OK;
    for (int g = 0; g < buckets.count && st == TD_OK; g++) {
        const bucket *b = &buckets.items[g];
        for (int d = 0; d < ndevices && st == TD_OK; d++) {
            td_tensor *const *row = inputs + (size_t)d * (size_t)ntensors;
            st = flatten(row, b, td_tensor_device(row[b->members[0]]), &flats[d]);
        }
        td_tensor *sum = NULL;
        if (st == TD_OK)
            st = td_comm_reduce_add(flats, ndevices, dest, &sum);
        if (st == TD_OK)
            st = unflatten(sum, inputs, b, out);
        td_tensor_release(sum);
        release_all(flats, ndevices);
    }
    free(flats);
    buckets_free(&buckets);
    if (st != TD_OK)
        release_all(out, ntensors);
    return st;
}

/* ---- scatter ------------------------------------------------------------------------------ */

static td_status check_stream(td_stream *s, int i, td_device device)
{
    td_device sd = td_stream_device(s);
    if (!td_device_equal(sd, device))
        return error_fmt(TD_ERR_INVALID,
                         "Expected the device associated with the stream at index %d (was %d) to match the device "
                         "supplied at that index (expected %d)",
                         i, sd.index, device.index);
    return TD_OK;
}

/* chunk copied onto device under streams[i] (when given) as the current stream of device. */
static td_status scatter_one(td_tensor *chunk, td_device device, td_stream *stream, td_tensor **out)
{
    td_stream_guard guard;
    if (stream)
        TD_TRY(td_stream_guard_enter(&guard, stream));
    td_status st = td_tensor_to_device(chunk, device, true, out);
    if (stream)
        td_stream_guard_exit(&guard);
    return st;
}

static const char *list_str(char *buf, size_t len, const int64_t *v, int n)
{
    return tensor_format_sizes(buf, len, n, v);
}

td_status td_comm_scatter(td_tensor *src, const td_device *devices, int ndevices, const int64_t *chunk_sizes,
                          int nchunk_sizes, int dim, td_stream *const *streams, td_tensor **out, int *nout)
{
    if (!src || !out || !nout || ndevices < 0 || (ndevices > 0 && !devices))
        return error_fmt(TD_ERR_INVALID, "td_comm_scatter: %s", !src ? "tensor is NULL" : "bad devices or out");
    *nout = 0;
    if (ndevices == 0)
        return error_fmt(TD_ERR_INVALID, "Expected at least one device to scatter to");
    if (chunk_sizes && nchunk_sizes != ndevices)
        return error_fmt(TD_ERR_INVALID,
                         "Expected devices and chunk_sizes to be of same length, but got len(devices) = %d and "
                         "len(chunk_sizes) = %d",
                         ndevices, nchunk_sizes);
    if (ndevices > COMM_MAX_DEVICES)
        return error_fmt(TD_ERR_INVALID, "td_comm_scatter: at most %d devices, got %d", COMM_MAX_DEVICES, ndevices);
    td_device resolved[COMM_MAX_DEVICES];
    for (int i = 0; i < ndevices; i++)
        TD_TRY(resolve_listed(devices[i], &resolved[i]));
    int d = 0;
    TD_TRY(tensor_wrap_dim(dim, src->ndim, &d));
    if (src->ndim == 0)
        return error_fmt(TD_ERR_INVALID, "chunk expects at least a 1-dimensional tensor");
    int64_t size = src->sizes[d];
    int64_t sizes[COMM_MAX_DEVICES];
    int nchunks;
    if (chunk_sizes) {
        int64_t sum = 0;
        char b[COMM_MAX_DEVICES * 22 + 4];
        for (int i = 0; i < ndevices; i++) {
            if (chunk_sizes[i] < 0)
                return error_fmt(TD_ERR_INVALID,
                                 "split_with_sizes expects split_sizes have only non-negative entries, but got "
                                 "split_sizes=%s",
                                 list_str(b, sizeof b, chunk_sizes, ndevices));
            sum += chunk_sizes[i];
            sizes[i] = chunk_sizes[i];
        }
        if (sum != size)
            return error_fmt(TD_ERR_INVALID,
                             "split_with_sizes expects split_sizes to sum exactly to %lld (input tensor's size at "
                             "dimension %d), but got split_sizes=%s",
                             (long long)size, d, list_str(b, sizeof b, chunk_sizes, ndevices));
        nchunks = ndevices;
    } else {
        /* torch.chunk: ceil(size / n) per chunk, so there may be fewer chunks than devices. */
        int64_t split = (size + ndevices - 1) / ndevices;
        if (split == 0) {
            nchunks = ndevices; /* size 0: n empty chunks */
            for (int i = 0; i < nchunks; i++)
                sizes[i] = 0;
        } else {
            nchunks = (int)((size + split - 1) / split);
            for (int i = 0; i < nchunks; i++)
                sizes[i] = i + 1 < nchunks ? split : size - split * (nchunks - 1);
        }
    }
    for (int i = 0; i < nchunks; i++)
        out[i] = NULL;
    td_device home = td_tensor_device(src);
    int64_t start = 0;
    for (int i = 0; i < nchunks; i++) {
        td_tensor *chunk = NULL;
        td_status st = td_tensor_narrow(src, d, start, sizes[i], &chunk);
        start += sizes[i];
        if (st == TD_OK && td_device_equal(home, resolved[i])) {
            out[i] = chunk; /* a view: no copy */
            continue;
        }
        td_stream *stream = streams ? streams[i] : NULL;
        if (st == TD_OK && stream)
            st = check_stream(stream, i, resolved[i]);
        if (st == TD_OK)
            st = scatter_one(chunk, resolved[i], stream, &out[i]);
        td_tensor_release(chunk);
        if (st != TD_OK) {
            release_all(out, i);
            return st;
        }
    }
    *nout = nchunks;
    return TD_OK;
}

td_status td_comm_scatter_out(td_tensor *src, td_tensor *const *outs, int nouts, int dim, td_stream *const *streams)
{
    if (!src || nouts < 0 || (nouts > 0 && !outs))
        return error_fmt(TD_ERR_INVALID, "td_comm_scatter_out: %s", !src ? "tensor is NULL" : "bad outs");
    if (nouts == 0)
        return error_fmt(TD_ERR_INVALID, "Expected at least one output tensor to scatter to");
    int d = 0;
    TD_TRY(tensor_wrap_dim(dim, src->ndim, &d));
    int64_t total = 0;
    char b1[SIZES_BUF], b2[SIZES_BUF], dev[32];
    for (int i = 0; i < nouts; i++) {
        const td_tensor *o = outs[i];
        if (!o)
            return error_fmt(TD_ERR_INVALID, "td_comm_scatter_out: output tensor at index %d is NULL", i);
        if (tensor_is_host(o))
            return error_fmt(TD_ERR_INVALID,
                             "Expected all output tensors to be CUDA tensors, but output tensor at index %d has device "
                             "'%s'",
                             i, td_device_str(td_tensor_device(o), dev, sizeof dev));
        bool same = o->ndim == src->ndim;
        for (int k = 0; same && k < o->ndim; k++)
            same = k == d || o->sizes[k] == src->sizes[k];
        if (!same)
            return error_fmt(TD_ERR_INVALID,
                             "Output tensor at index %d has incorrect shape: %s. Expected same shape except for "
                             "scatter dim %d as the source tensor: %s.",
                             i, sizes_str(b1, o), d, sizes_str(b2, src));
        total += o->ndim ? o->sizes[d] : 1;
    }
    int64_t size = src->ndim ? src->sizes[d] : 1;
    if (total != size)
        return error_fmt(TD_ERR_INVALID,
                         "Total size for output tensors along scatter dim %d does not match the source tensor size at "
                         "dim %d. Expected %lld, but got total size %lld",
                         d, d, (long long)size, (long long)total);
    int64_t start = 0;
    for (int i = 0; i < nouts; i++) {
        td_tensor *o = outs[i];
        int64_t len = o->ndim ? o->sizes[d] : 1;
        td_tensor *chunk = NULL;
        td_status st = src->ndim ? td_tensor_narrow(src, d, start, len, &chunk) : TD_OK;
        if (!src->ndim)
            chunk = td_tensor_retain(src);
        start += len;
        td_stream *stream = streams ? streams[i] : NULL;
        td_stream_guard guard;
        bool guarded = false;
        if (st == TD_OK && stream && (st = check_stream(stream, i, td_tensor_device(o))) == TD_OK)
            guarded = (st = td_stream_guard_enter(&guard, stream)) == TD_OK;
        if (st == TD_OK)
            st = td_tensor_copy_ex(o, chunk, true);
        if (guarded)
            td_stream_guard_exit(&guard);
        td_tensor_release(chunk);
        if (st != TD_OK)
            return st;
    }
    return TD_OK;
}

/* ---- gather ------------------------------------------------------------------------------- */

/* PyTorch's is_channels_last_strides_2d_s4: the strides of a 4-d tensor order C, W, H, N from the
 * fastest, with its rules for ambiguous size-1 dims (NCHW wins ties). */
static bool suggests_channels_last(const td_tensor *t)
{
    if (t->ndim != 4 || t->strides[1] == 0)
        return false;
    static const int order[4] = {1, 3, 2, 0};
    int64_t min = 0;
    for (int k = 0; k < 4; k++) {
        int dd = order[k];
        if (t->sizes[dd] == 0 || t->strides[dd] < min)
            return false;
        if (dd == 0 && min == t->strides[1])
            return false;
        min = t->strides[dd];
        if (t->sizes[dd] > 1)
            min *= t->sizes[dd];
    }
    return true;
}

/* (N, C, H, W) laid out as NHWC: (H*W*C, 1, W*C, C). */
static void channels_last_strides(const td_shape *shape, int64_t strides[4])
{
    int64_t c = shape->d[1], h = shape->d[2], w = shape->d[3];
    strides[0] = h * w * c;
    strides[1] = 1;
    strides[2] = w * c;
    strides[3] = c;
}

/* Checks inputs as gather and gather_out do and computes the gathered shape. device_quotes: gather
 * prints the device bare, gather_out quoted, as PyTorch does. */
static td_status gather_check(td_tensor *const *inputs, int ninputs, int dim, bool device_quotes, int *wrapped,
                              td_shape *shape, bool *channels_last)
{
    if (ninputs <= 0 || !inputs)
        return error_fmt(TD_ERR_INVALID, "Expected at least one tensor to gather from");
    for (int i = 0; i < ninputs; i++) {
        if (!inputs[i])
            return error_fmt(TD_ERR_INVALID, "td_comm_gather: input tensor at index %d is NULL", i);
    }
    const td_tensor *first = inputs[0];
    int d = 0;
    TD_TRY(tensor_wrap_dim(dim, first->ndim, &d));
    if (first->ndim == 0)
        return error_fmt(TD_ERR_INVALID, "td_comm_gather: cannot gather 0-dim tensors along a dim");
    td_shape expected = td_tensor_shape(first);
    bool cl = suggests_channels_last(first);
    int64_t total = 0;
    char b1[SIZES_BUF], b2[SIZES_BUF], dev[32];
    for (int i = 0; i < ninputs; i++) {
        const td_tensor *t = inputs[i];
        if (tensor_is_host(t))
            return error_fmt(TD_ERR_INVALID,
                             device_quotes ? "Expected all input tensors to be CUDA tensors, but tensor at index %d has "
                                             "device '%s'"
                                           : "Expected all input tensors to be CUDA tensors, but tensor at index %d has "
                                             "device %s",
                             i, td_device_str(td_tensor_device(t), dev, sizeof dev));
        /* "index 1has": PyTorch's words, missing space included. */
        if (t->ndim != expected.ndim)
            return error_fmt(TD_ERR_INVALID,
                             "Expected all input tensors to have the same number of dimensions, but tensor at index "
                             "%dhas %d dimensions, (expected %d)",
                             i, t->ndim, expected.ndim);
        expected.d[d] = t->sizes[d];
        for (int k = 0; k < t->ndim; k++) {
            if (expected.d[k] != t->sizes[k])
                return error_fmt(TD_ERR_INVALID, "Input tensor at index %d has invalid shape %s, but expected %s", i,
                                 sizes_str(b1, t), tensor_format_sizes(b2, sizeof b2, expected.ndim, expected.d));
        }
        total += t->sizes[d];
        if (cl && !suggests_channels_last(t))
            cl = false;
    }
    expected.d[d] = total;
    *wrapped = d;
    *shape = expected;
    *channels_last = cl;
    return TD_OK;
}

/* Each input into its slice of out along dim (non_blocking when out is on a device). */
static td_status gather_into(td_tensor *const *inputs, int ninputs, int d, td_tensor *out)
{
    int64_t start = 0;
    bool non_blocking = !tensor_is_host(out);
    for (int i = 0; i < ninputs; i++) {
        td_tensor *slice = NULL;
        TD_TRY(td_tensor_narrow(out, d, start, inputs[i]->sizes[d], &slice));
        td_status st = td_tensor_copy_ex(slice, inputs[i], non_blocking);
        td_tensor_release(slice);
        if (st != TD_OK)
            return st;
        start += inputs[i]->sizes[d];
    }
    return TD_OK;
}

td_status td_comm_gather(td_tensor *const *inputs, int ninputs, int dim, td_device destination, td_tensor **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_comm_gather: out is NULL");
    int d = 0;
    td_shape shape;
    bool channels_last = false;
    TD_TRY(gather_check(inputs, ninputs, dim, false, &d, &shape, &channels_last));
    td_device dest = cpu_device;
    if (destination.type != TD_DEVICE_CPU)
        TD_TRY(td_device_resolve(destination, &dest)); /* -1: the current device, not the inputs' */
    int64_t strides[4];
    if (channels_last)
        channels_last_strides(&shape, strides);
    TD_TRY(td_tensor_empty_on(dest, inputs[0]->dtype, shape, channels_last ? strides : NULL, out));
    td_status st = gather_into(inputs, ninputs, d, *out);
    if (st != TD_OK) {
        td_tensor_release(*out);
        *out = NULL;
        return st;
    }
    atomic_store(&td_tensor_storage(*out)->version, 0);
    return TD_OK;
}

td_status td_comm_gather_out(td_tensor *const *inputs, int ninputs, int dim, td_tensor *out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_comm_gather_out: out is NULL");
    int d = 0;
    td_shape shape;
    bool channels_last = false;
    TD_TRY(gather_check(inputs, ninputs, dim, true, &d, &shape, &channels_last));
    bool same = out->ndim == shape.ndim;
    for (int k = 0; same && k < shape.ndim; k++)
        same = out->sizes[k] == shape.d[k];
    char b1[SIZES_BUF], b2[SIZES_BUF];
    if (!same)
        return error_fmt(TD_ERR_INVALID, "Expected out tensor to have shape %s, but got %s",
                         tensor_format_sizes(b1, sizeof b1, shape.ndim, shape.d), sizes_str(b2, out));
    return gather_into(inputs, ninputs, d, out);
}

/* ---- cat ---------------------------------------------------------------------------------- */

/* torch.cat's legacy rule: a 1-D tensor of size 0 takes no part in dim wrapping or the shape
 * checks (it still counts for the dtype). */
static bool cat_skips(const td_tensor *t) { return t->ndim == 1 && t->sizes[0] == 0; }

/* The checks in torch.cat's order: the dispatcher's device check, then cat_meta's zero-dim check,
 * dim wrapping against the first tensor not skipped, the empty-list check (which the others cannot
 * reach first), and the shape check of each tensor against that first one. */
static td_status cat_check(const td_tensor *const *tensors, int n, int dim, int *wrapped, int *valid)
{
    if (n == 0)
        return error_fmt(TD_ERR_INVALID, "torch.cat(): expected a non-empty list of Tensors");
    td_device device = td_tensor_device(tensors[0]);
    char d1[32], d2[32];
    for (int i = 1; i < n; i++) {
        td_device other = td_tensor_device(tensors[i]);
        if (!td_device_equal(other, device))
            return error_fmt(TD_ERR_INVALID,
                             "Expected all tensors to be on the same device, but found at least two devices, %s and "
                             "%s!",
                             td_device_str(device, d1, sizeof d1), td_device_str(other, d2, sizeof d2));
    }
    for (int i = 0; i < n; i++) {
        if (tensors[i]->ndim == 0)
            return error_fmt(TD_ERR_INVALID, "zero-dimensional tensor (at position %d) cannot be concatenated", i);
    }
    *valid = -1;
    for (int i = 0; i < n && *valid < 0; i++) {
        if (!cat_skips(tensors[i]))
            *valid = i;
    }
    *wrapped = dim;
    if (*valid < 0)
        return TD_OK; /* every input is a skipped [0]: the result is a [0] */
    const td_tensor *first = tensors[*valid];
    TD_TRY(tensor_wrap_dim(dim, first->ndim, wrapped));
    for (int i = 0; i < n; i++) {
        const td_tensor *t = tensors[i];
        if (cat_skips(t))
            continue;
        if (t->ndim != first->ndim)
            return error_fmt(TD_ERR_INVALID, "Tensors must have same number of dimensions: got %d and %d", first->ndim,
                             t->ndim);
        for (int k = 0; k < t->ndim; k++) {
            if (k != *wrapped && t->sizes[k] != first->sizes[k])
                return error_fmt(TD_ERR_INVALID,
                                 "Sizes of tensors must match except in dimension %d. Expected size %lld but got size "
                                 "%lld for tensor number %d in the list.",
                                 *wrapped, (long long)first->sizes[k], (long long)t->sizes[k], i);
        }
    }
    return TD_OK;
}

td_status td_tensor_cat(const td_tensor *const *tensors, int n, int dim, td_tensor **out)
{
    if (!out || n < 0 || (n > 0 && !tensors))
        return error_fmt(TD_ERR_INVALID, "td_tensor_cat: %s", !out ? "out is NULL" : "bad tensors or count");
    *out = NULL;
    for (int i = 0; i < n; i++) {
        if (!tensors[i])
            return error_fmt(TD_ERR_INVALID, "td_tensor_cat: tensor %d is NULL", i);
    }
    int d = 0, valid = -1;
    TD_TRY(cat_check(tensors, n, dim, &d, &valid));
    td_dtype dtype = tensors[0]->dtype;
    bool channels_last = true;
    for (int i = 0; i < n; i++) {
        dtype = td_dtype_promote(dtype, tensors[i]->dtype);
        channels_last = channels_last && suggests_channels_last(tensors[i]);
    }
    td_shape shape = TD_SHAPE(0);
    if (valid >= 0) {
        shape = td_tensor_shape(tensors[valid]);
        int64_t total = 0;
        for (int i = 0; i < n; i++) {
            if (!cat_skips(tensors[i]) && __builtin_add_overflow(total, tensors[i]->sizes[d], &total))
                return error_fmt(TD_ERR_INVALID, "torch.cat(): the size along dimension %d overflows", d);
        }
        shape.d[d] = total;
    }
    int64_t strides[4];
    if (channels_last)
        channels_last_strides(&shape, strides);
    /* Ops follow their inputs: the result goes on the inputs' device (an explicit index, not the
     * current device), and each copy below runs on that device's current stream. */
    td_device device = td_tensor_device(tensors[0]);
    td_tensor *result = NULL;
    TD_TRY(td_tensor_empty_on(device, dtype, shape, channels_last ? strides : NULL, &result));
    bool non_blocking = !tensor_is_host(result);
    int64_t start = 0;
    td_status st = TD_OK;
    for (int i = 0; i < n && st == TD_OK && valid >= 0; i++) {
        const td_tensor *t = tensors[i];
        if (cat_skips(t))
            continue;
        td_tensor *slice = NULL;
        st = td_tensor_narrow(result, d, start, t->sizes[d], &slice);
        if (st == TD_OK)
            st = td_tensor_copy_ex(slice, t, non_blocking);
        td_tensor_release(slice);
        start += t->sizes[d];
    }
    if (st != TD_OK) {
        td_tensor_release(result);
        return st;
    }
    atomic_store(&result->storage->version, 0); /* a new tensor */
    *out = result;
    return TD_OK;
}

/* ---- scatter and gather over td_value trees (torch.nn.parallel.scatter_gather) ------------ */

/* One node's pieces: count values (new references) in an array of ndevices slots. */
typedef struct pieces {
    td_value **items;
    int count;
} pieces;

static void pieces_free(pieces *p, int n)
{
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < p[i].count; k++)
            td_value_release(p[i].items[k]);
        free(p[i].items);
    }
    free(p);
}

static td_status scatter_map(const td_value *v, const td_device *devices, int ndevices, int dim, int depth,
                             td_value **out, int *count);

/* Scatters each of the n members of a container (member(v, i)) into p[i]; *count: the fewest
 * pieces any member gave (upstream zips them). */
static td_status scatter_members(const td_value *const *members, int n, const td_device *devices, int ndevices,
                                 int dim, int depth, pieces **out, int *count)
{
    pieces *p = TD_NEW_ARRAY(pieces, (size_t)n);
    int fewest = ndevices;
    for (int i = 0; i < n; i++) {
        p[i].items = TD_NEW_ARRAY(td_value *, (size_t)ndevices);
        td_status st = scatter_map(members[i], devices, ndevices, dim, depth + 1, p[i].items, &p[i].count);
        if (st != TD_OK) {
            pieces_free(p, i + 1);
            return st;
        }
        if (p[i].count < fewest)
            fewest = p[i].count;
    }
    *out = p;
    *count = n > 0 ? fewest : 0;
    return TD_OK;
}

static td_status scatter_tensor(const td_value *v, const td_device *devices, int ndevices, int dim, td_value **out,
                                int *count)
{
    td_tensor *chunks[COMM_MAX_DEVICES];
    int nchunks = 0;
    TD_TRY(td_comm_scatter(td_value_get_tensor(v), devices, ndevices, NULL, 0, dim, NULL, chunks, &nchunks));
    for (int i = 0; i < nchunks; i++) {
        out[i] = td_value_tensor(chunks[i]);
        td_tensor_release(chunks[i]);
    }
    *count = nchunks;
    return TD_OK;
}

/* A dict: each (key, value) entry scattered as upstream scatters the pair, then one dict per
 * device. */
static td_status scatter_dict(const td_value *v, const td_device *devices, int ndevices, int dim, int depth,
                              td_value **out, int *count)
{
    size_t len = td_value_len(v);
    const td_value **members = TD_NEW_ARRAY(const td_value *, 2 * len);
    for (size_t i = 0; i < len; i++) {
        members[2 * i] = td_value_dict_key_at(v, i);
        members[2 * i + 1] = td_value_dict_value_at(v, i);
    }
    pieces *p = NULL;
    int n = 0;
    td_status st = scatter_members(members, (int)(2 * len), devices, ndevices, dim, depth, &p, &n);
    free(members);
    TD_TRY(st);
    int made = 0;
    for (; made < n && st == TD_OK; made++) {
        out[made] = td_value_dict_new();
        for (size_t i = 0; i < len && st == TD_OK; i++)
            st = td_value_dict_set(out[made], td_value_retain(p[2 * i].items[made]),
                                   td_value_retain(p[2 * i + 1].items[made]));
    }
    pieces_free(p, (int)(2 * len));
    if (st != TD_OK) {
        for (int i = 0; i < made; i++)
            td_value_release(out[i]);
        return st;
    }
    *count = n;
    return TD_OK;
}

/* A record, tuple or list: one container of the same kind (and record tag) per device. */
static td_status scatter_sequence(const td_value *v, const td_device *devices, int ndevices, int dim, int depth,
                                  td_value **out, int *count)
{
    td_value_kind kind = td_value_kind_of(v);
    size_t len = td_value_len(v);
    const td_value **members = TD_NEW_ARRAY(const td_value *, len ? len : 1);
    for (size_t i = 0; i < len; i++)
        members[i] = td_value_at(v, i);
    pieces *p = NULL;
    int n = 0;
    td_status st = scatter_members(members, (int)len, devices, ndevices, dim, depth, &p, &n);
    free(members);
    TD_TRY(st);
    for (int k = 0; k < n; k++) {
        td_value *c = kind == TD_VAL_RECORD  ? td_value_record_new(td_value_record_tag(v), len)
                      : kind == TD_VAL_TUPLE ? td_value_tuple_new(len)
                                             : td_value_list_new();
        for (size_t i = 0; i < len; i++) {
            td_value *item = td_value_retain(p[i].items[k]);
            /* cannot fail: the index is in range and the kind is a sequence */
            if (kind == TD_VAL_LIST)
                (void)td_value_list_append(c, item);
            else
                (void)td_value_set(c, i, item);
        }
        out[k] = c;
    }
    pieces_free(p, (int)len);
    *count = n;
    return TD_OK;
}

static td_status scatter_map(const td_value *v, const td_device *devices, int ndevices, int dim, int depth,
                             td_value **out, int *count)
{
    if (depth > TD_VALUE_MAX_DEPTH)
        return error_fmt(TD_ERR_INVALID, "td_comm_scatter_value: the value nests deeper than %d containers",
                         TD_VALUE_MAX_DEPTH);
    td_value_kind kind = td_value_kind_of(v);
    switch (kind) {
    case TD_VAL_TENSOR:
        return scatter_tensor(v, devices, ndevices, dim, out, count);
    case TD_VAL_RECORD: /* a namedtuple, empty or not */
        return scatter_sequence(v, devices, ndevices, dim, depth, out, count);
    case TD_VAL_TUPLE:
    case TD_VAL_LIST:
        if (td_value_len(v) > 0)
            return scatter_sequence(v, devices, ndevices, dim, depth, out, count);
        break;
    case TD_VAL_DICT:
        if (td_value_len(v) > 0)
            return scatter_dict(v, devices, ndevices, dim, depth, out, count);
        break;
    default:
        break;
    }
    for (int i = 0; i < ndevices; i++)
        out[i] = td_value_retain((td_value *)v); /* replicated: the same object on every device */
    *count = ndevices;
    return TD_OK;
}

td_status td_comm_scatter_value(const td_value *v, const td_device *devices, int ndevices, int dim, td_value **out,
                                int *nout)
{
    if (!v || !out || !nout || ndevices < 0 || (ndevices > 0 && !devices))
        return error_fmt(TD_ERR_INVALID, "td_comm_scatter_value: %s", !v ? "value is NULL" : "bad devices or out");
    *nout = 0;
    if (ndevices == 0)
        return error_fmt(TD_ERR_INVALID, "Expected at least one device to scatter to");
    if (ndevices > COMM_MAX_DEVICES)
        return error_fmt(TD_ERR_INVALID, "td_comm_scatter_value: at most %d devices, got %d", COMM_MAX_DEVICES,
                         ndevices);
    /* Devices are checked once, so a bad one fails the same way whether or not v holds a tensor. */
    for (int i = 0; i < ndevices; i++) {
        td_device resolved;
        TD_TRY(resolve_listed(devices[i], &resolved));
    }
    int count = 0;
    TD_TRY(scatter_map(v, devices, ndevices, dim, 1, out, &count));
    *nout = count;
    return TD_OK;
}

/* Python's warnings show once per place; so does this one. */
static atomic_bool scalar_gather_warned;

static td_status gather_map(const td_value *const *outputs, int n, int dim, td_device dest, int depth,
                            td_value **out);

static td_status gather_tensors(const td_value *const *outputs, int n, int dim, td_device dest, td_value **out)
{
    td_tensor **inputs = TD_NEW_ARRAY(td_tensor *, (size_t)n);
    bool all_scalars = true;
    for (int i = 0; i < n; i++) {
        td_tensor *t = td_value_get_tensor(outputs[i]);
        all_scalars = all_scalars && t->ndim == 0;
        if (tensor_is_host(t)) {
            free(inputs);
            return error_set_typed(TD_ERR_INVALID, "AssertionError", "Gather function not implemented for CPU tensors");
        }
    }
    td_status st = TD_OK;
    for (int i = 0; i < n && st == TD_OK; i++) {
        td_tensor *t = td_value_get_tensor(outputs[i]);
        if (all_scalars && dim == 0)
            st = td_tensor_view(t, TD_SHAPE(1), &inputs[i]);
        else
            inputs[i] = td_tensor_retain(t);
    }
    if (st == TD_OK && all_scalars && dim == 0 && !atomic_exchange(&scalar_gather_warned, true))
        TD_LOG_WARN("Was asked to gather along dimension 0, but all input tensors were scalars; will instead "
                    "unsqueeze and return a vector.");
    td_tensor *result = NULL;
    if (st == TD_OK)
        st = td_comm_gather(inputs, n, dim, dest, &result);
    release_all(inputs, n); /* zeroed: entries never set are NULL */
    free(inputs);
    if (st != TD_OK)
        return st;
    *out = td_value_tensor(result);
    td_tensor_release(result);
    return TD_OK;
}

static td_status gather_dict(const td_value *const *outputs, int n, int dim, td_device dest, int depth,
                             td_value **out)
{
    const td_value *first = outputs[0];
    size_t len = td_value_len(first);
    for (int i = 1; i < n; i++) {
        if (td_value_len(outputs[i]) != len)
            return error_set_typed(TD_ERR_INVALID, "ValueError", "All dicts must have the same number of keys");
    }
    const td_value **column = TD_NEW_ARRAY(const td_value *, (size_t)n);
    td_value *result = td_value_dict_new();
    td_status st = TD_OK;
    for (size_t k = 0; k < len && st == TD_OK; k++) {
        td_value *key = td_value_dict_key_at(first, k);
        for (int i = 0; i < n && st == TD_OK; i++) {
            column[i] = td_value_dict_get(outputs[i], key);
            if (!column[i]) {
                char *repr = td_value_format(key);
                st = error_set_typed(TD_ERR_NOT_FOUND, "KeyError", repr);
                free(repr);
            }
        }
        td_value *gathered = NULL;
        if (st == TD_OK)
            st = gather_map(column, n, dim, dest, depth + 1, &gathered);
        if (st == TD_OK)
            st = td_value_dict_set(result, td_value_retain(key), gathered);
    }
    free(column);
    if (st != TD_OK) {
        td_value_release(result);
        return st;
    }
    *out = result;
    return TD_OK;
}

/* A record, tuple or list: element j gathered from every output's element j, over the shortest
 * output (upstream zips them); records of one tag must agree in length, as namedtuples of one type
 * do. */
static td_status gather_sequence(const td_value *const *outputs, int n, int dim, td_device dest, int depth,
                                 td_value **out)
{
    const td_value *first = outputs[0];
    td_value_kind kind = td_value_kind_of(first);
    size_t len = td_value_len(first);
    for (int i = 1; i < n; i++) {
        size_t li = td_value_len(outputs[i]);
        if (kind == TD_VAL_RECORD && li != len)
            return error_fmt(TD_ERR_INVALID,
                             "td_comm_gather_value: records of tag %u differ in length: output 0 has %zu fields, output "
                             "%d has %zu",
                             td_value_record_tag(first), len, i, li);
        if (li < len)
            len = li;
    }
    td_value *result = kind == TD_VAL_RECORD  ? td_value_record_new(td_value_record_tag(first), len)
                       : kind == TD_VAL_TUPLE ? td_value_tuple_new(len)
                                              : td_value_list_new();
    const td_value **column = TD_NEW_ARRAY(const td_value *, (size_t)n);
    td_status st = TD_OK;
    for (size_t j = 0; j < len && st == TD_OK; j++) {
        for (int i = 0; i < n; i++)
            column[i] = td_value_at(outputs[i], j);
        td_value *gathered = NULL;
        st = gather_map(column, n, dim, dest, depth + 1, &gathered);
        if (st == TD_OK)
            st = kind == TD_VAL_LIST ? td_value_list_append(result, gathered) : td_value_set(result, j, gathered);
    }
    free(column);
    if (st != TD_OK) {
        td_value_release(result);
        return st;
    }
    *out = result;
    return TD_OK;
}

static td_status gather_map(const td_value *const *outputs, int n, int dim, td_device dest, int depth,
                            td_value **out)
{
    if (depth > TD_VALUE_MAX_DEPTH)
        return error_fmt(TD_ERR_INVALID, "td_comm_gather_value: the outputs nest deeper than %d containers",
                         TD_VALUE_MAX_DEPTH);
    const td_value *first = outputs[0];
    td_value_kind kind = td_value_kind_of(first);
    if (kind == TD_VAL_NONE) {
        *out = td_value_none();
        return TD_OK;
    }
    for (int i = 1; i < n; i++) {
        td_value_kind ki = td_value_kind_of(outputs[i]);
        if (ki != kind || (kind == TD_VAL_RECORD && td_value_record_tag(outputs[i]) != td_value_record_tag(first)))
            return error_set_typed(TD_ERR_INVALID, "TypeError",
                                   kind == TD_VAL_RECORD && ki == kind
                                       ? "td_comm_gather_value: outputs hold records of different tags at one place"
                                       : "td_comm_gather_value: outputs hold values of different kinds at one place");
    }
    switch (kind) {
    case TD_VAL_TENSOR:
        return gather_tensors(outputs, n, dim, dest, out);
    case TD_VAL_DICT:
        return gather_dict(outputs, n, dim, dest, depth, out);
    case TD_VAL_RECORD:
    case TD_VAL_TUPLE:
    case TD_VAL_LIST:
        return gather_sequence(outputs, n, dim, dest, depth, out);
    default: {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "td_comm_gather_value: cannot gather values of kind %s (only tensors, None, lists, tuples, dicts and "
                 "records gather)",
                 td_value_kind_name(kind));
        return error_set_typed(TD_ERR_INVALID, "TypeError", msg);
    }
    }
}

td_status td_comm_gather_value(const td_value *const *outputs, int n, int dim, td_device destination, td_value **out)
{
    if (!out || n < 0 || (n > 0 && !outputs))
        return error_fmt(TD_ERR_INVALID, "td_comm_gather_value: %s", !out ? "out is NULL" : "bad outputs");
    *out = NULL;
    if (n == 0)
        return error_fmt(TD_ERR_INVALID, "td_comm_gather_value: expected at least one output to gather from");
    for (int i = 0; i < n; i++) {
        if (!outputs[i])
            return error_fmt(TD_ERR_INVALID, "td_comm_gather_value: output %d is NULL", i);
    }
    td_device dest = cpu_device;
    if (destination.type != TD_DEVICE_CPU)
        TD_TRY(td_device_resolve(destination, &dest)); /* -1: the current device, resolved once */
    return gather_map(outputs, n, dim, dest, 1, out);
}
