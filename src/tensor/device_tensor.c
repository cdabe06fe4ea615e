/* Tensors on devices: device storage, placement, and dst.copy_(src) between any two devices.
 *
 * A device tensor is an ordinary strided tensor whose storage holds device memory from the caching
 * allocator (td_device_malloc, allocated for the current stream of its device) and whose
 * storage->device names the device; the host-side files refuse it through tensor_require_host.
 * Copies follow the contract of spec/cuda_multigpu.md section 5: between two devices the bytes
 * move on the source device's current stream between two events (the destination's current stream
 * is reached first, then waits for the copy); on one device on its current stream; to and from the
 * host on the device's current stream, blocking unless the host side is pinned and the caller asked
 * for non_blocking. A byte copy needs both sides dense with the same strides: the other cases stage
 * through a dense temporary on one side and use that side's strided copy (the implementation's
 * kernel on a device, strided_copy on the host). dtype conversion is host-side only. normal_ and
 * uniform_ run the implementation's Philox kernel with the (seed, offset) taken from the device's
 * generator (src/device/rng.c), writing a dense tensor in place and any other through a dense
 * temporary. */
#include "tensor/device_tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "device/device_impl.h"
#include "device/philox.h"
#include "tensor/dtype.h"
#include "tensor/storage.h"
#include "tensor/strided.h"

static const td_device cpu_device = {TD_DEVICE_CPU, -1};

td_status tensor_require_host(const td_tensor *t, const char *fn)
{
    if (!t || tensor_is_host(t))
        return TD_OK;
    char dev[32];
    return error_fmt(TD_ERR_UNSUPPORTED,
                     "%s needs a CPU tensor, but got a tensor on %s: copy it to the host first (td_tensor_to_device)",
                     fn, td_device_str(t->storage->device, dev, sizeof dev));
}

td_device td_tensor_device(const td_tensor *t)
{
    if (!t || tensor_is_host(t))
        return cpu_device;
    return t->storage->device;
}

/* ---- storage ------------------------------------------------------------------------------ */

static void device_storage_free(void *data, size_t nbytes, void *ctx)
{
    (void)nbytes;
    (void)ctx;
    td_device_free(data);
}

static const td_storage_allocator device_storage_allocator = {
    .kind = TD_STORAGE_DEVICE,
    .name = "device",
    .free = device_storage_free,
};

static void pinned_storage_free(void *data, size_t nbytes, void *ctx)
{
    (void)nbytes;
    (void)ctx;
    td_host_free(data);
}

static const td_storage_allocator pinned_storage_allocator = {
    .kind = TD_STORAGE_PINNED,
    .name = "pinned",
    .free = pinned_storage_free,
};

/* Bytes a tensor of sizes and strides (NULL: contiguous) reaches from offset 0; checks the shape. */
static td_status storage_bytes_for(td_dtype dtype, const td_shape *shape, const int64_t *strides, size_t *out)
{
    if (!td_dtype_is_valid((int)dtype))
        return error_fmt(TD_ERR_INVALID, "invalid dtype %d", (int)dtype);
    if (shape->ndim < 0 || shape->ndim > TD_MAX_DIMS)
        return error_fmt(TD_ERR_INVALID, "a tensor has 0 to %d dims, got a shape with %d", TD_MAX_DIMS, shape->ndim);
    int64_t numel = 1, span = 1;
    for (int i = 0; i < shape->ndim; i++) {
        char b[TD_MAX_DIMS * 22 + 4];
        if (shape->d[i] < 0)
            return error_fmt(TD_ERR_INVALID, "Trying to create tensor with negative dimension %lld: %s",
                             (long long)shape->d[i], tensor_format_sizes(b, sizeof b, shape->ndim, shape->d));
        if (__builtin_mul_overflow(numel, shape->d[i], &numel))
            return error_fmt(TD_ERR_INVALID, "tensor of shape %s is too large",
                             tensor_format_sizes(b, sizeof b, shape->ndim, shape->d));
        if (strides) {
            int64_t term;
            if (strides[i] < 0)
                return error_fmt(TD_ERR_INVALID, "empty_strided: negative strides are not supported, got %lld at dim %d",
                                 (long long)strides[i], i);
            if (shape->d[i] > 0 && (__builtin_mul_overflow(shape->d[i] - 1, strides[i], &term) ||
                                    __builtin_add_overflow(span, term, &span)))
                return error_fmt(TD_ERR_INVALID, "tensor with these sizes and strides is too large");
        }
    }
    int64_t elems = numel == 0 ? 0 : (strides ? span : numel);
    size_t bytes;
    if (__builtin_mul_overflow((size_t)elems, td_dtype_size(dtype), &bytes) || bytes > (size_t)INT64_MAX)
        return error_fmt(TD_ERR_INVALID, "tensor of dtype %s is too large: its byte size overflows", td_dtype_name(dtype));
    *out = bytes;
    return TD_OK;
}

td_status td_tensor_empty_on(td_device device, td_dtype dtype, td_shape shape, const int64_t *strides, td_tensor **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_tensor_empty_on: out is NULL");
    *out = NULL;
    size_t nbytes;
    TD_TRY(storage_bytes_for(dtype, &shape, strides, &nbytes));
    td_storage *storage = NULL;
    if (device.type == TD_DEVICE_CPU) {
        if (!strides)
            return td_tensor_empty(dtype, shape, out);
        TD_TRY(storage_new_uninit(nbytes, &storage));
    } else {
        td_device resolved;
        TD_TRY(td_device_resolve(device, &resolved));
        void *ptr = NULL;
        TD_TRY(td_device_malloc(resolved, nbytes, NULL, &ptr));
        storage = storage_new_with(ptr, nbytes, resolved, &device_storage_allocator, NULL, false);
    }
    td_status st = td_tensor_from_storage(storage, 0, dtype, shape, strides, out);
    td_storage_release(storage);
    return st;
}

/* ---- kernels ------------------------------------------------------------------------------ */

static td_stream *stream_of(td_device resolved) { return device_current_stream(resolved); }

static device_strided kernel_operand(const td_tensor *t)
{
    device_strided d = {.base = tensor_data_of(t), .ndim = t->ndim};
    for (int i = 0; i < t->ndim; i++) {
        d.sizes[i] = t->sizes[i];
        d.strides[i] = t->strides[i];
    }
    if (t->ndim == 0) {
        d.ndim = 1;
        d.sizes[0] = 1;
        d.strides[0] = 1;
    }
    return d;
}

/* dst = src (same dtype and sizes, both on the device of stream s) queued on s. */
static td_status device_strided_copy(const td_tensor *dst, const td_tensor *src, td_stream *s)
{
    const device_impl *impl = device_impl_of(s->device.type);
    device_strided d = kernel_operand(dst), sr = kernel_operand(src);
    return impl->strided_copy(s->device.index, &d, &sr, td_dtype_size(dst->dtype), s->native);
}

bool tensor_is_dense(const td_tensor *t)
{
    int64_t numel = td_tensor_numel(t);
    if (numel <= 1)
        return true;
    /* Dims of size > 1 sorted by stride must tile memory exactly: strides 1, s0, s0*s1, ... */
    int order[TD_MAX_DIMS], n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->sizes[i] > 1)
            order[n++] = i;
    }
    for (int i = 1; i < n; i++) {
        int key = order[i], j = i - 1;
        while (j >= 0 && t->strides[order[j]] > t->strides[key]) {
            order[j + 1] = order[j];
            j--;
        }
        order[j + 1] = key;
    }
    int64_t expected = 1;
    for (int i = 0; i < n; i++) {
        if (t->strides[order[i]] != expected)
            return false;
        expected *= t->sizes[order[i]];
    }
    return true;
}

/* Both dense with the same strides on every dim that matters: the elements are the same bytes. */
static bool same_dense_layout(const td_tensor *a, const td_tensor *b)
{
    if (!tensor_is_dense(a) || !tensor_is_dense(b))
        return false;
    for (int i = 0; i < a->ndim; i++) {
        if (a->sizes[i] > 1 && a->strides[i] != b->strides[i])
            return false;
    }
    return true;
}

/* The strides of t when it is dense (to give a staging buffer t's layout), else NULL. */
static const int64_t *dense_strides(const td_tensor *t) { return tensor_is_dense(t) ? t->strides : NULL; }

/* A dense copy of t on its own side: a device one queued on the current stream of its device. */
static td_status dense_copy_same_side(const td_tensor *t, td_tensor **out)
{
    if (tensor_is_host(t))
        return td_tensor_clone(t, out);
    TD_TRY(td_tensor_empty_on(t->storage->device, t->dtype, td_tensor_shape(t), NULL, out));
    td_status st = device_strided_copy(*out, t, stream_of(t->storage->device));
    if (st != TD_OK) {
        td_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

static td_status host_strided_copy(const td_tensor *dst, const td_tensor *src)
{
    td_strided d = strided_of(dst), s = strided_of(src);
    return strided_copy(&d, &s);
}

/* ---- copies ------------------------------------------------------------------------------- */

/* The byte copy between a dense src and a dense dst of the same layout, on the sides they are on.
 * stream: the stream the copy is queued on (NULL for host to host). */
static td_status byte_copy(const td_tensor *dst, const td_tensor *src, td_stream *stream)
{
    size_t nbytes = (size_t)td_tensor_numel(dst) * td_dtype_size(dst->dtype);
    void *dptr = tensor_data_of(dst);
    const void *sptr = tensor_data_of(src);
    bool dh = tensor_is_host(dst), sh = tensor_is_host(src);
    if (dh && sh) {
        memmove(dptr, sptr, nbytes);
        return TD_OK;
    }
    const device_impl *impl = device_impl_of(stream->device.type);
    if (!dh && !sh && dst->storage->device.index != src->storage->device.index)
        return impl->memcpy_peer_async(dst->storage->device.index, dptr, src->storage->device.index, sptr, nbytes,
                                       stream->native);
    device_copy_kind kind = dh ? DEVICE_COPY_D2H : sh ? DEVICE_COPY_H2D : DEVICE_COPY_D2D;
    return impl->memcpy_async(stream->device.index, dptr, sptr, nbytes, kind, stream->native);
}

/* src and dst on one device: that device's current stream. */
static td_status copy_same_device(td_tensor *dst, const td_tensor *src)
{
    td_stream *s = stream_of(dst->storage->device);
    if (same_dense_layout(dst, src))
        return byte_copy(dst, src, s);
    return device_strided_copy(dst, src, s);
}

/* src on device a, dst on device b (same type): on a's current stream, fenced both ways. */
static td_status copy_cross_device(td_tensor *dst, const td_tensor *src)
{
    td_stream *src_stream = stream_of(src->storage->device);
    td_stream *dst_stream = stream_of(dst->storage->device);
    td_tensor *staged_src = NULL, *staged_dst = NULL;
    td_event *dst_ready = NULL, *src_ready = NULL;
    td_status st = TD_OK;
    const td_tensor *from = src;
    td_tensor *to = dst;
    if (!tensor_is_dense(src)) {
        st = dense_copy_same_side(src, &staged_src); /* on src_stream */
        if (st != TD_OK)
            goto done;
        from = staged_src;
    }
    if (!same_dense_layout(dst, from)) {
        st = td_tensor_empty_on(dst->storage->device, dst->dtype, td_tensor_shape(dst), from->strides, &staged_dst);
        if (st != TD_OK)
            goto done;
        to = staged_dst;
    }
    if ((st = td_event_create(TD_EVENT_DEFAULT, &dst_ready)) != TD_OK ||
        (st = td_event_record(dst_ready, dst_stream)) != TD_OK ||
        (st = td_stream_wait_event(src_stream, dst_ready)) != TD_OK)
        goto done;
    if ((st = byte_copy(to, from, src_stream)) != TD_OK)
        goto done;
    if ((st = td_event_create(TD_EVENT_DEFAULT, &src_ready)) != TD_OK ||
        (st = td_event_record(src_ready, src_stream)) != TD_OK ||
        (st = td_stream_wait_event(dst_stream, src_ready)) != TD_OK)
        goto done;
    /* staged_dst was used on src_stream; its later users on dst's device are ordered after
     * src_ready, and the caching allocator gives it to other streams only after its free. */
    if (staged_dst)
        st = device_strided_copy(dst, staged_dst, dst_stream);
done:
    td_event_release(dst_ready);
    td_event_release(src_ready);
    td_tensor_release(staged_src);
    td_tensor_release(staged_dst);
    return st;
}

/* One side on the host, the other on a device: the device's current stream. */
static td_status copy_host_device(td_tensor *dst, const td_tensor *src, bool non_blocking)
{
    bool to_device = tensor_is_host(src);
    td_device device = to_device ? dst->storage->device : src->storage->device;
    td_stream *stream = stream_of(device);
    td_tensor *staged_src = NULL, *staged_dst = NULL;
    td_status st = TD_OK;
    const td_tensor *from = src;
    td_tensor *to = dst;
    if (!tensor_is_dense(src)) {
        if ((st = dense_copy_same_side(src, &staged_src)) != TD_OK)
            goto done;
        from = staged_src;
    }
    if (!same_dense_layout(dst, from)) {
        if ((st = td_tensor_empty_on(td_tensor_device(dst), dst->dtype, td_tensor_shape(dst), from->strides,
                                     &staged_dst)) != TD_OK)
            goto done;
        to = staged_dst;
    }
    const td_tensor *host_side = to_device ? from : to;
    bool pinned = td_host_is_pinned(tensor_data_of(host_side));
    if ((st = byte_copy(to, from, stream)) != TD_OK)
        goto done;
    if (pinned && (st = td_host_record_stream(tensor_data_of(host_side), stream)) != TD_OK)
        goto done;
    if (to_device) {
        if (staged_dst && (st = device_strided_copy(dst, staged_dst, stream)) != TD_OK)
            goto done;
        /* A host source the caller owns may change once we return: wait unless it is pinned
         * memory the caller handed over asynchronously (a staged copy is ours and dies here). */
        if (!(non_blocking && pinned && !staged_src))
            st = td_stream_synchronize(stream);
    } else {
        if (!(non_blocking && pinned && !staged_dst))
            st = td_stream_synchronize(stream);
        if (st == TD_OK && staged_dst)
            st = host_strided_copy(dst, staged_dst);
    }
done:
    td_tensor_release(staged_src);
    td_tensor_release(staged_dst);
    return st;
}

/* dst = src with src already broadcast to dst's shape. */
static td_status copy_expanded(td_tensor *dst, const td_tensor *src, bool non_blocking)
{
    bool dh = tensor_is_host(dst), sh = tensor_is_host(src);
    if (src->dtype != dst->dtype && !(dh && sh)) {
        /* Conversions run on the host: src comes to the host as it is, converts there, and a
         * device destination receives the converted copy. */
        td_tensor *host_src = NULL, *converted = NULL;
        if (sh)
            host_src = td_tensor_retain((td_tensor *)src);
        else
            TD_TRY(td_tensor_to_device((td_tensor *)src, cpu_device, false, &host_src));
        td_status st;
        if (dh) {
            st = host_strided_copy(dst, host_src);
        } else {
            st = td_tensor_to(host_src, dst->dtype, &converted);
            if (st == TD_OK)
                st = copy_host_device(dst, converted, false);
        }
        td_tensor_release(converted);
        td_tensor_release(host_src);
        return st;
    }
    if (dh && sh)
        return host_strided_copy(dst, src);
    if (dh || sh)
        return copy_host_device(dst, src, non_blocking);
    td_device a = src->storage->device, b = dst->storage->device;
    if (a.type != b.type) {
        td_tensor *host = NULL;
        TD_TRY(td_tensor_to_device((td_tensor *)src, cpu_device, false, &host));
        td_status st = copy_host_device(dst, host, false);
        td_tensor_release(host);
        return st;
    }
    if (a.index == b.index)
        return copy_same_device(dst, src);
    return copy_cross_device(dst, src);
}

static bool same_view(const td_tensor *a, const td_tensor *b)
{
    if (a->storage != b->storage || a->offset != b->offset || a->dtype != b->dtype || a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++) {
        if (a->sizes[i] != b->sizes[i] || a->strides[i] != b->strides[i])
            return false;
    }
    return true;
}

td_status td_tensor_copy_ex(td_tensor *dst, const td_tensor *src, bool non_blocking)
{
    if (!dst || !src)
        return error_fmt(TD_ERR_INVALID, "td_tensor_copy_ex: %s is NULL", dst ? "src" : "dst");
    if (dst == src || same_view(dst, src))
        return TD_OK;
    td_tensor *expanded = NULL;
    TD_TRY(td_tensor_expand((td_tensor *)src, td_tensor_shape(dst), &expanded));
    td_status st = TD_OK;
    if (td_tensor_numel(dst) > 0)
        st = copy_expanded(dst, expanded, non_blocking);
    td_tensor_release(expanded);
    if (st == TD_OK)
        storage_bump_version(dst->storage);
    return st;
}

/* ---- placement ---------------------------------------------------------------------------- */

static td_status fill_kernel(td_tensor *t, const void *value, td_dtype vtype)
{
    int64_t numel = td_tensor_numel(t);
    if (numel == 0)
        return TD_OK;
    unsigned char bytes[16];
    tensor_convert_element(bytes, t->dtype, value, vtype);
    td_stream *s = stream_of(t->storage->device);
    const device_impl *impl = device_impl_of(s->device.type);
    size_t es = td_dtype_size(t->dtype);
    if (tensor_is_dense(t))
        return impl->fill(s->device.index, tensor_data_of(t), (size_t)numel, bytes, es, s->native);
    td_tensor *tmp = NULL;
    TD_TRY(td_tensor_empty_on(t->storage->device, t->dtype, td_tensor_shape(t), NULL, &tmp));
    td_status st = impl->fill(s->device.index, tensor_data_of(tmp), (size_t)numel, bytes, es, s->native);
    if (st == TD_OK)
        st = device_strided_copy(t, tmp, s);
    td_tensor_release(tmp);
    return st;
}

td_status tensor_device_fill(td_tensor *t, const void *value, td_dtype vtype)
{
    TD_TRY(fill_kernel(t, value, vtype));
    storage_bump_version(t->storage);
    return TD_OK;
}

td_status td_tensor_full_on(td_device device, td_dtype dtype, td_shape shape, double value, td_tensor **out)
{
    TD_TRY(td_tensor_empty_on(device, dtype, shape, NULL, out));
    td_status st = tensor_is_host(*out) ? td_tensor_fill(*out, value) : fill_kernel(*out, &value, TD_FLOAT64);
    if (st != TD_OK) {
        td_tensor_release(*out);
        *out = NULL;
        return st;
    }
    /* A factory's result starts at version 0, as torch.full's does. */
    atomic_store(&(*out)->storage->version, 0);
    return TD_OK;
}

td_status td_tensor_to_device(td_tensor *t, td_device device, bool non_blocking, td_tensor **out)
{
    if (!t || !out)
        return error_fmt(TD_ERR_INVALID, "td_tensor_to_device: %s is NULL", t ? "out" : "tensor");
    td_device target = cpu_device;
    if (device.type != TD_DEVICE_CPU)
        TD_TRY(td_device_resolve(device, &target));
    if (td_device_equal(td_tensor_device(t), target)) {
        *out = td_tensor_retain(t);
        return TD_OK;
    }
    /* memory_format=preserve: a dense tensor keeps its strides, others become contiguous. */
    return tensor_copy_new(t, target, t->dtype, dense_strides(t), non_blocking, out);
}

td_status tensor_copy_new(const td_tensor *t, td_device device, td_dtype dtype, const int64_t *strides,
                          bool non_blocking, td_tensor **out)
{
    TD_TRY(td_tensor_empty_on(device, dtype, td_tensor_shape(t), strides, out));
    td_status st = td_tensor_copy_ex(*out, t, non_blocking);
    if (st != TD_OK) {
        td_tensor_release(*out);
        *out = NULL;
        return st;
    }
    atomic_store(&(*out)->storage->version, 0); /* a new tensor */
    return TD_OK;
}

td_status tensor_device_to(const td_tensor *t, td_dtype dtype, td_tensor **out)
{
    return tensor_copy_new(t, t->storage->device, dtype, NULL, false, out);
}

/* ---- pinned memory and versions ----------------------------------------------------------- */

td_status td_tensor_pin_memory(const td_tensor *t, td_tensor **out)
{
    if (!t || !out)
        return error_fmt(TD_ERR_INVALID, "td_tensor_pin_memory: %s is NULL", t ? "out" : "tensor");
    if (!tensor_is_host(t)) {
        char dev[32];
        return error_fmt(TD_ERR_INVALID, "cannot pin a tensor on %s: only dense CPU tensors can be pinned",
                         td_device_str(t->storage->device, dev, sizeof dev));
    }
    size_t nbytes = td_tensor_nbytes(t);
    void *ptr = NULL;
    TD_TRY(td_host_alloc(nbytes ? nbytes : 1, &ptr));
    td_storage *storage = storage_new_with(ptr, nbytes, cpu_device, &pinned_storage_allocator, NULL, false);
    td_status st = td_tensor_from_storage(storage, 0, t->dtype, td_tensor_shape(t), NULL, out);
    td_storage_release(storage);
    if (st == TD_OK && nbytes && (st = host_strided_copy(*out, t)) != TD_OK) {
        td_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

bool td_tensor_is_pinned(const td_tensor *t)
{
    if (!t || !tensor_is_host(t))
        return false;
    return storage_kind_of(t->storage) == TD_STORAGE_PINNED ||
           (t->storage->data && td_host_is_pinned(t->storage->data));
}

uint64_t td_tensor_version(const td_tensor *t) { return t ? (uint64_t)atomic_load(&t->storage->version) : 0; }

/* ---- ops ---------------------------------------------------------------------------------- */

static td_status add_check(const td_tensor *a, const td_tensor *b)
{
    char da[32], db[32];
    td_device_str(td_tensor_device(a), da, sizeof da);
    td_device_str(td_tensor_device(b), db, sizeof db);
    if (tensor_is_host(a) || tensor_is_host(b) || !td_device_equal(a->storage->device, b->storage->device))
        return error_fmt(TD_ERR_UNSUPPORTED,
                         "td_tensor_add: expected both tensors on the same device, but found %s and %s: copy them "
                         "to one device first (td_tensor_to_device)",
                         da, db);
    if (a->dtype != b->dtype || !strided_same_sizes(a, b) || !td_tensor_is_contiguous(a) || !td_tensor_is_contiguous(b))
        return error_fmt(TD_ERR_UNSUPPORTED,
                         "td_tensor_add on %s supports contiguous operands of one dtype and shape only (got %s and %s): "
                         "copy them to the host for the general op",
                         da, td_dtype_name(a->dtype), td_dtype_name(b->dtype));
    return TD_OK;
}

static td_status add_kernel(td_tensor *dst, const td_tensor *a, const td_tensor *b)
{
    int64_t n = td_tensor_numel(dst);
    if (n == 0)
        return TD_OK;
    td_stream *s = stream_of(dst->storage->device);
    return device_impl_of(s->device.type)->add(s->device.index, tensor_data_of(dst), tensor_data_of(a),
                                                tensor_data_of(b), (size_t)n, dst->dtype, s->native);
}

td_status tensor_device_add(const td_tensor *a, const td_tensor *b, td_tensor **out)
{
    TD_TRY(add_check(a, b));
    TD_TRY(td_tensor_empty_on(a->storage->device, a->dtype, td_tensor_shape(a), NULL, out));
    td_status st = add_kernel(*out, a, b);
    if (st != TD_OK) {
        td_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

td_status tensor_device_add_into(td_tensor *dst, const td_tensor *src)
{
    TD_TRY(add_check(dst, src));
    TD_TRY(add_kernel(dst, dst, src));
    storage_bump_version(dst->storage);
    return TD_OK;
}

/* ---- random ------------------------------------------------------------------------------- */

/* c10's ScalarType names, which PyTorch's "not implemented for" messages use. */
static const char *scalar_type_name(td_dtype dtype)
{
    switch (dtype) {
    case TD_BOOL: return "Bool";
    case TD_UINT8: return "Byte";
    case TD_INT8: return "Char";
    case TD_INT16: return "Short";
    case TD_INT32: return "Int";
    case TD_INT64: return "Long";
    case TD_FLOAT16: return "Half";
    case TD_BFLOAT16: return "BFloat16";
    case TD_FLOAT32: return "Float";
    case TD_FLOAT64: return "Double";
    case TD_COMPLEX64: return "ComplexFloat";
    case TD_COMPLEX128: return "ComplexDouble";
    default: return "Undefined";
    }
}

static double dtype_max(td_dtype dtype)
{
    switch (dtype) {
    case TD_FLOAT16: return 65504.0;
    case TD_BFLOAT16: return 0x1.fep127;
    case TD_FLOAT32: return 0x1.fffffep127;
    default: return 0x1.fffffffffffffp1023;
    }
}

static td_status random_check(const td_tensor *t, const char *fn, const char *kernel)
{
    if (!t)
        return error_fmt(TD_ERR_INVALID, "%s: tensor is NULL", fn);
    if (tensor_is_host(t))
        return error_fmt(TD_ERR_UNSUPPORTED,
                         "%s needs a device tensor (tdist has no CPU generator), but got a tensor on cpu: move it to "
                         "a device first (td_tensor_to_device)",
                         fn);
    td_dtype dt = t->dtype;
    if (dt != TD_FLOAT16 && dt != TD_BFLOAT16 && dt != TD_FLOAT32 && dt != TD_FLOAT64)
        return error_fmt(TD_ERR_UNSUPPORTED, "\"%s_%s\" not implemented for '%s'", kernel,
                         td_device_type_name(t->storage->device.type), scalar_type_name(dt));
    return TD_OK;
}

/* Fills t (a device tensor of a float dtype) from the generator of its device. */
static td_status random_fill(td_tensor *t, int dist, double a, double b)
{
    int64_t numel = td_tensor_numel(t);
    if (numel == 0)
        return TD_OK;
    td_device device = t->storage->device;
    td_stream *s = stream_of(device);
    const device_impl *impl = device_impl_of(device.type);
    td_tensor *tmp = NULL;
    td_tensor *target = t;
    if (!tensor_is_dense(t)) {
        TD_TRY(td_tensor_empty_on(device, t->dtype, td_tensor_shape(t), NULL, &tmp));
        target = tmp;
    }
    uint64_t seed, offset;
    device_rng_take(device, &seed, &offset);
    /* A dense tensor's lowest element is element 0 (strides are never negative): the kernel
     * writes its numel elements in memory order. */
    td_status st = impl->random(device.index, tensor_data_of(target), (size_t)numel, t->dtype, dist, a, b, seed,
                                offset, s->native);
    if (st == TD_OK && tmp)
        st = device_strided_copy(t, tmp, s);
    td_tensor_release(tmp);
    if (st == TD_OK)
        storage_bump_version(t->storage);
    return st;
}

td_status td_tensor_normal_(td_tensor *t, double mean, double std)
{
    TD_TRY(random_check(t, "td_tensor_normal_", "normal_kernel"));
    if (!(std >= 0.0))
        return error_fmt(TD_ERR_INVALID, "normal expects std >= 0.0, but found std %g", std);
    return random_fill(t, PHILOX_DIST_NORMAL, mean, std);
}

td_status td_tensor_uniform_(td_tensor *t, double from, double to)
{
    TD_TRY(random_check(t, "td_tensor_uniform_", "uniform_kernel"));
    if (!(from <= to))
        return error_fmt(TD_ERR_INVALID, "uniform_ expects to return a [from, to) range, but found from=%g > to=%g", from,
                         to);
    if (!(to - from <= dtype_max(t->dtype)))
        return error_fmt(TD_ERR_INVALID,
                         "uniform_ expects to-from <= std::numeric_limits<%s>::max(), but found to=%g and from=%g "
                         "which result in to-from to exceed the limit",
                         scalar_type_name(t->dtype), to, from);
    return random_fill(t, PHILOX_DIST_UNIFORM, from, to);
}
