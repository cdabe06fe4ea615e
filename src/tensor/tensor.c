/* Strided tensors: creation, properties and views (view, reshape, narrow, select, transpose,
 * permute, expand, unsqueeze, squeeze, flatten, contiguous, clone, to).
 *
 * Views follow PyTorch's stride rules and error messages (ATen's TensorShape.cpp and
 * computeStride in TensorUtils.cpp), so that code and tests written against torch behave the same.
 * Data movement (copy, fill, element access) is in copy.c; printing in format.c; shapes and strided
 * descriptors, which both build on, in strided.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "tensor/device_tensor.h"
#include "tensor/dtype.h"
#include "tensor/storage.h"
#include "tensor/strided.h"

/* Checks a shape for creating a tensor and computes its byte size. */
static td_status check_shape(td_dtype dtype, const td_shape *shape, size_t *nbytes)
{
    TD_TRY(dtype_check((int)dtype));
    if (shape->ndim < 0 || shape->ndim > TD_MAX_DIMS)
        return error_fmt(TD_ERR_INVALID, "a tensor has 0 to %d dims, got a shape with %d", TD_MAX_DIMS, shape->ndim);
    char b[TD_MAX_DIMS * 22 + 4];
    for (int i = 0; i < shape->ndim; i++) {
        if (shape->d[i] < 0)
            return error_fmt(TD_ERR_INVALID, "Trying to create tensor with negative dimension %lld: %s",
                            (long long)shape->d[i], tensor_format_sizes(b, sizeof b, shape->ndim, shape->d));
    }
    int64_t numel = strided_numel(shape->ndim, shape->d);
    size_t bytes;
    if (numel < 0 || __builtin_mul_overflow((size_t)numel, td_dtype_size(dtype), &bytes) ||
        bytes > (size_t)INT64_MAX)
        return error_fmt(TD_ERR_INVALID, "tensor of shape %s and dtype %s is too large: its byte size overflows",
                        tensor_format_sizes(b, sizeof b, shape->ndim, shape->d), td_dtype_name(dtype));
    *nbytes = bytes;
    return TD_OK;
}

static td_tensor *tensor_on(td_storage *storage, int64_t offset, td_dtype dtype, int ndim, const int64_t *sizes,
                            const int64_t *strides)
{
    td_tensor *t = TD_NEW(td_tensor);
    ref_init(&t->refcount);
    t->storage = td_storage_retain(storage);
    t->offset = offset;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->sizes[i] = sizes[i];
    if (strides) {
        for (int i = 0; i < ndim; i++)
            t->strides[i] = strides[i];
    } else {
        strided_contiguous_strides(ndim, sizes, t->strides);
    }
    return t;
}

td_tensor *tensor_new_view(const td_tensor *t, int64_t offset, int ndim, const int64_t *sizes,
                              const int64_t *strides)
{
    return tensor_on(t->storage, offset, t->dtype, ndim, sizes, strides);
}

/* ---- creation --------------------------------------------------------------------------------- */

static td_status create(td_dtype dtype, td_shape shape, bool zero, td_tensor **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "tensor creation: out is NULL");
    size_t nbytes;
    TD_TRY(check_shape(dtype, &shape, &nbytes));
    td_storage *s;
    TD_TRY(zero ? td_storage_new(nbytes, &s) : storage_new_uninit(nbytes, &s));
    *out = tensor_on(s, 0, dtype, shape.ndim, shape.d, NULL);
    td_storage_release(s);
    return TD_OK;
}

td_status td_tensor_empty(td_dtype dtype, td_shape shape, td_tensor **out) { return create(dtype, shape, false, out); }
td_status td_tensor_zeros(td_dtype dtype, td_shape shape, td_tensor **out) { return create(dtype, shape, true, out); }

td_status td_tensor_full(td_dtype dtype, td_shape shape, double value, td_tensor **out)
{
    TD_TRY(create(dtype, shape, false, out));
    td_status st = td_tensor_fill(*out, value);
    if (st != TD_OK) {
        td_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

td_status td_tensor_ones(td_dtype dtype, td_shape shape, td_tensor **out) { return td_tensor_full(dtype, shape, 1.0, out); }

td_status td_tensor_arange(td_dtype dtype, double start, double end, double step, td_tensor **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_tensor_arange: out is NULL");
    TD_TRY(dtype_check((int)dtype));
    if (!isfinite(start) || !isfinite(end))
        return error_fmt(TD_ERR_INVALID, "unsupported range: %g -> %g", start, end);
    if (step == 0 || isnan(step))
        return error_fmt(TD_ERR_INVALID, "step must be nonzero");
    if (!((step > 0 && end >= start) || (step < 0 && end <= start)))
        return error_fmt(TD_ERR_INVALID, "upper bound and larger bound inconsistent with step sign");
    double n = ceil((end - start) / step);
    if (!(n < 9.2e18))
        return error_fmt(TD_ERR_INVALID,
                        "invalid size, possible overflow? (arange from %g to %g by %g has too many elements)", start,
                        end, step);
    TD_TRY(create(dtype, TD_SHAPE((int64_t)n), false, out));
    td_tensor *t = *out;
    char *p = td_tensor_data(t);
    size_t es = td_dtype_size(dtype);
    for (int64_t i = 0; i < (int64_t)n; i++) {
        double v = start + (double)i * step;
        tensor_convert_element(p + (size_t)i * es, dtype, &v, TD_FLOAT64);
    }
    return TD_OK;
}

td_status td_tensor_from_buffer(td_dtype dtype, td_shape shape, const void *data, td_tensor **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_tensor_from_buffer: out is NULL");
    size_t nbytes;
    TD_TRY(check_shape(dtype, &shape, &nbytes));
    if (!data && nbytes)
        return error_fmt(TD_ERR_INVALID, "td_tensor_from_buffer: data is NULL for %zu bytes", nbytes);
    TD_TRY(create(dtype, shape, false, out));
    if (nbytes)
        memcpy(td_tensor_data(*out), data, nbytes);
    return TD_OK;
}

td_status td_tensor_from_storage(td_storage *storage, int64_t offset, td_dtype dtype, td_shape shape,
                                 const int64_t *strides, td_tensor **out)
{
    if (!out || !storage)
        return error_fmt(TD_ERR_INVALID, "td_tensor_from_storage: %s is NULL", storage ? "out" : "storage");
    size_t nbytes;
    TD_TRY(check_shape(dtype, &shape, &nbytes));
    if (offset < 0)
        return error_fmt(TD_ERR_INVALID, "Tensor: invalid storage offset %lld", (long long)offset);
    char b1[TD_MAX_DIMS * 22 + 4], b2[TD_MAX_DIMS * 22 + 4];
    if (strides) {
        for (int i = 0; i < shape.ndim; i++) {
            if (strides[i] < 0)
                return error_fmt(TD_ERR_INVALID, "as_strided: Negative strides are not supported at the moment, got strides: %s",
                                tensor_format_sizes(b1, sizeof b1, shape.ndim, strides));
        }
    }
    int64_t st[TD_MAX_DIMS];
    if (strides)
        memcpy(st, strides, sizeof(int64_t) * (size_t)shape.ndim);
    else
        strided_contiguous_strides(shape.ndim, shape.d, st);
    /* The last element reached, in elements; computed with overflow checks as the inputs are the
     * caller's (or, through the mp layer, a peer's). */
    int64_t numel = strided_numel(shape.ndim, shape.d);
    uint64_t need = 0;
    bool overflow = false;
    if (numel > 0) {
        int64_t last = offset, term;
        for (int i = 0; i < shape.ndim; i++) {
            if (__builtin_mul_overflow(shape.d[i] - 1, st[i], &term) || __builtin_add_overflow(last, term, &last))
                overflow = true;
        }
        if (!overflow && __builtin_mul_overflow((uint64_t)last + 1, (uint64_t)td_dtype_size(dtype), &need))
            overflow = true;
    }
    if (overflow || need > storage->nbytes)
        return error_fmt(TD_ERR_INVALID,
                        "setStorage: sizes %s, strides %s, storage offset %lld, and itemsize %zu requiring a storage "
                        "size of %llu are out of bounds for storage of size %zu",
                        tensor_format_sizes(b1, sizeof b1, shape.ndim, shape.d),
                        tensor_format_sizes(b2, sizeof b2, shape.ndim, st), (long long)offset, td_dtype_size(dtype),
                        overflow ? (unsigned long long)UINT64_MAX : (unsigned long long)need, storage->nbytes);
    *out = tensor_on(storage, offset, dtype, shape.ndim, shape.d, st);
    return TD_OK;
}

td_tensor *td_tensor_retain(td_tensor *t)
{
    if (t)
        ref_inc(&t->refcount);
    return t;
}

void td_tensor_release(td_tensor *t)
{
    if (!t || !ref_dec(&t->refcount))
        return;
    if (t->autograd)
        t->autograd->free(t->autograd);
    td_storage_release(t->storage);
    free(t);
}

/* ---- properties ------------------------------------------------------------------------------- */

td_dtype td_tensor_dtype(const td_tensor *t) { return t->dtype; }
int td_tensor_ndim(const td_tensor *t) { return t->ndim; }
td_shape td_tensor_shape(const td_tensor *t) { return td_shape_of(t->ndim, t->sizes); }
const int64_t *td_tensor_sizes(const td_tensor *t) { return t->sizes; }
const int64_t *td_tensor_strides(const td_tensor *t) { return t->strides; }
int64_t td_tensor_numel(const td_tensor *t) { return strided_numel(t->ndim, t->sizes); }
size_t td_tensor_nbytes(const td_tensor *t) { return (size_t)td_tensor_numel(t) * td_dtype_size(t->dtype); }
int64_t td_tensor_offset(const td_tensor *t) { return t->offset; }
td_storage *td_tensor_storage(const td_tensor *t) { return t->storage; }

/* For a 0-dim tensor the size is 1 and the stride 1 (dims -1 and 0), as torch's size(0) would
 * fail; that keeps loops over dims simple for callers. A bad dim returns -1 with the message set. */
int64_t td_tensor_size(const td_tensor *t, int dim)
{
    int d = 0;
    if (tensor_wrap_dim(dim, t->ndim, &d) != TD_OK)
        return -1;
    return t->ndim ? t->sizes[d] : 1;
}

int64_t td_tensor_stride(const td_tensor *t, int dim)
{
    int d = 0;
    if (tensor_wrap_dim(dim, t->ndim, &d) != TD_OK)
        return -1;
    return t->ndim ? t->strides[d] : 1;
}

bool td_tensor_is_contiguous(const td_tensor *t) { return strided_is_contiguous(t->ndim, t->sizes, t->strides); }

void *td_tensor_data(const td_tensor *t) { return tensor_data_of(t); }

/* ---- views ------------------------------------------------------------------------------------ */

static td_status check_args(const td_tensor *t, td_tensor **out, const char *fn)
{
    if (!t || !out)
        return error_fmt(TD_ERR_INVALID, "%s: %s is NULL", fn, t ? "out" : "tensor");
    return TD_OK;
}

/* at::infer_size: resolves one -1 against numel. */
static td_status infer_size(const td_shape *shape, int64_t numel, int64_t *res)
{
    char b[TD_MAX_DIMS * 22 + 4];
    if (shape->ndim < 0 || shape->ndim > TD_MAX_DIMS)
        return error_fmt(TD_ERR_INVALID, "a tensor has 0 to %d dims, got a shape with %d", TD_MAX_DIMS, shape->ndim);
    int64_t newsize = 1;
    int infer_dim = -1;
    for (int d = 0; d < shape->ndim; d++) {
        res[d] = shape->d[d];
        if (shape->d[d] == -1) {
            if (infer_dim >= 0)
                return error_fmt(TD_ERR_INVALID, "only one dimension can be inferred");
            infer_dim = d;
        } else if (shape->d[d] >= 0) {
            if (__builtin_mul_overflow(newsize, shape->d[d], &newsize))
                return error_fmt(TD_ERR_INVALID, "shape '%s' is invalid for input of size %lld",
                                tensor_format_sizes(b, sizeof b, shape->ndim, shape->d), (long long)numel);
        } else {
            return error_fmt(TD_ERR_INVALID, "invalid shape dimension %lld", (long long)shape->d[d]);
        }
    }
    if (numel == newsize || (infer_dim >= 0 && newsize > 0 && numel % newsize == 0)) {
        if (infer_dim >= 0) {
            if (newsize == 0)
                return error_fmt(TD_ERR_INVALID,
                                "cannot reshape tensor of 0 elements into shape %s because the unspecified dimension "
                                "size -1 can be any value and is ambiguous",
                                tensor_format_sizes(b, sizeof b, shape->ndim, shape->d));
            res[infer_dim] = numel / newsize;
        }
        return TD_OK;
    }
    return error_fmt(TD_ERR_INVALID, "shape '%s' is invalid for input of size %lld",
                    tensor_format_sizes(b, sizeof b, shape->ndim, shape->d), (long long)numel);
}

/* ATen's computeStride: strides for viewing (oldshape, oldstride) as newshape without a copy, or
 * false when some new dim would span two non-contiguous chunks of the old layout. */
static bool compute_stride(int oldnd, const int64_t *oldshape, const int64_t *oldstride, int newnd,
                           const int64_t *newshape, int64_t *newstride)
{
    if (oldnd == 0) {
        for (int i = 0; i < newnd; i++)
            newstride[i] = 1;
        return true;
    }
    int64_t numel = strided_numel(oldnd, oldshape);
    if (numel == 0) {
        bool same = oldnd == newnd;
        for (int i = 0; same && i < oldnd; i++)
            same = oldshape[i] == newshape[i];
        if (same) {
            memcpy(newstride, oldstride, sizeof(int64_t) * (size_t)oldnd);
            return true;
        }
        for (int d = newnd - 1; d >= 0; d--)
            newstride[d] = d == newnd - 1 ? 1 : (newshape[d + 1] > 1 ? newshape[d + 1] : 1) * newstride[d + 1];
        return true;
    }
    int view_d = newnd - 1;
    int64_t chunk_base_stride = oldstride[oldnd - 1];
    int64_t tensor_numel = 1, view_numel = 1;
    for (int tensor_d = oldnd - 1; tensor_d >= 0; tensor_d--) {
        tensor_numel *= oldshape[tensor_d];
        if (tensor_d == 0 ||
            (oldshape[tensor_d - 1] != 1 && oldstride[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 && (view_numel < tensor_numel || newshape[view_d] == 1)) {
                newstride[view_d] = view_numel * chunk_base_stride;
                view_numel *= newshape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel)
                return false;
            if (tensor_d > 0) {
                chunk_base_stride = oldstride[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

td_status td_tensor_view(td_tensor *t, td_shape shape, td_tensor **out)
{
    TD_TRY(check_args(t, out, "view"));
    int64_t sizes[TD_MAX_DIMS], strides[TD_MAX_DIMS];
    TD_TRY(infer_size(&shape, td_tensor_numel(t), sizes));
    if (!compute_stride(t->ndim, t->sizes, t->strides, shape.ndim, sizes, strides))
        return error_fmt(TD_ERR_INVALID,
                        "view size is not compatible with input tensor's size and stride (at least one dimension spans "
                        "across two contiguous subspaces). Use .reshape(...) instead.");
    *out = tensor_new_view(t, t->offset, shape.ndim, sizes, strides);
    return TD_OK;
}

td_status td_tensor_reshape(td_tensor *t, td_shape shape, td_tensor **out)
{
    TD_TRY(check_args(t, out, "reshape"));
    int64_t sizes[TD_MAX_DIMS], strides[TD_MAX_DIMS];
    TD_TRY(infer_size(&shape, td_tensor_numel(t), sizes));
    if (compute_stride(t->ndim, t->sizes, t->strides, shape.ndim, sizes, strides)) {
        *out = tensor_new_view(t, t->offset, shape.ndim, sizes, strides);
        return TD_OK;
    }
    td_tensor *c;
    TD_TRY(td_tensor_clone(t, &c));
    *out = tensor_new_view(c, c->offset, shape.ndim, sizes, NULL);
    td_tensor_release(c);
    return TD_OK;
}

td_status td_tensor_narrow(td_tensor *t, int dim, int64_t start, int64_t length, td_tensor **out)
{
    TD_TRY(check_args(t, out, "narrow"));
    if (t->ndim == 0)
        return error_fmt(TD_ERR_INVALID, "narrow() cannot be applied to a 0-dim tensor.");
    if (length < 0)
        return error_fmt(TD_ERR_INVALID, "narrow(): length must be non-negative.");
    int d = 0;
    TD_TRY(tensor_wrap_dim(dim, t->ndim, &d));
    int64_t cur = t->sizes[d];
    if (start < -cur || start > cur)
        return error_fmt(TD_ERR_INVALID, "start out of range (expected to be in range of [%lld, %lld], but got %lld)",
                        (long long)-cur, (long long)cur, (long long)start);
    if (start < 0)
        start += cur;
    if (start > cur - length)
        return error_fmt(TD_ERR_INVALID, "start (%lld) + length (%lld) exceeds dimension size (%lld).", (long long)start,
                        (long long)length, (long long)cur);
    int64_t sizes[TD_MAX_DIMS];
    memcpy(sizes, t->sizes, sizeof sizes);
    sizes[d] = length;
    *out = tensor_new_view(t, t->offset + start * t->strides[d], t->ndim, sizes, t->strides);
    return TD_OK;
}

td_status td_tensor_select(td_tensor *t, int dim, int64_t index, td_tensor **out)
{
    TD_TRY(check_args(t, out, "select"));
    if (t->ndim == 0)
        return error_fmt(TD_ERR_INVALID, "select() cannot be applied to a 0-dim tensor.");
    int d = 0;
    TD_TRY(tensor_wrap_dim(dim, t->ndim, &d));
    int64_t size = t->sizes[d];
    if (index < -size || index >= size) {
        char b[TD_MAX_DIMS * 22 + 4];
        return error_fmt(TD_ERR_INVALID, "select(): index %lld out of range for tensor of size %s at dimension %d",
                        (long long)index, tensor_format_sizes(b, sizeof b, t->ndim, t->sizes), dim);
    }
    if (index < 0)
        index += size;
    int64_t sizes[TD_MAX_DIMS], strides[TD_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == d)
            continue;
        sizes[n] = t->sizes[i];
        strides[n++] = t->strides[i];
    }
    *out = tensor_new_view(t, t->offset + index * t->strides[d], n, sizes, strides);
    return TD_OK;
}

td_status td_tensor_transpose(td_tensor *t, int dim0, int dim1, td_tensor **out)
{
    TD_TRY(check_args(t, out, "transpose"));
    int d0 = 0, d1 = 0;
    TD_TRY(tensor_wrap_dim(dim0, t->ndim, &d0));
    TD_TRY(tensor_wrap_dim(dim1, t->ndim, &d1));
    int64_t sizes[TD_MAX_DIMS], strides[TD_MAX_DIMS];
    memcpy(sizes, t->sizes, sizeof sizes);
    memcpy(strides, t->strides, sizeof strides);
    if (t->ndim > 0) {
        sizes[d0] = t->sizes[d1];
        sizes[d1] = t->sizes[d0];
        strides[d0] = t->strides[d1];
        strides[d1] = t->strides[d0];
    }
    *out = tensor_new_view(t, t->offset, t->ndim, sizes, strides);
    return TD_OK;
}

td_status td_tensor_permute(td_tensor *t, const int *dims, int ndim, td_tensor **out)
{
    TD_TRY(check_args(t, out, "permute"));
    if (ndim != t->ndim || (ndim > 0 && !dims))
        return error_fmt(TD_ERR_INVALID,
                        "permute(): number of dimensions in the tensor input does not match the length of the desired "
                        "ordering of dimensions i.e. input.dim() = %d is not equal to len(dims) = %d",
                        t->ndim, ndim);
    int64_t sizes[TD_MAX_DIMS], strides[TD_MAX_DIMS];
    bool seen[TD_MAX_DIMS] = {false};
    for (int i = 0; i < ndim; i++) {
        int d = 0;
        TD_TRY(tensor_wrap_dim(dims[i], ndim, &d));
        if (seen[d])
            return error_fmt(TD_ERR_INVALID, "permute(): duplicate dims are not allowed.");
        seen[d] = true;
        sizes[i] = t->sizes[d];
        strides[i] = t->strides[d];
    }
    *out = tensor_new_view(t, t->offset, ndim, sizes, strides);
    return TD_OK;
}

td_status td_tensor_expand(td_tensor *t, td_shape shape, td_tensor **out)
{
    TD_TRY(check_args(t, out, "expand"));
    char b1[TD_MAX_DIMS * 22 + 4], b2[TD_MAX_DIMS * 22 + 4];
    if (shape.ndim < 0 || shape.ndim > TD_MAX_DIMS)
        return error_fmt(TD_ERR_INVALID, "a tensor has 0 to %d dims, got a shape with %d", TD_MAX_DIMS, shape.ndim);
    if (shape.ndim < t->ndim)
        return error_fmt(TD_ERR_INVALID,
                        "expand(%s tensor of size %s, size=%s): the number of sizes provided (%d) must be greater or "
                        "equal to the number of dimensions in the tensor (%d)",
                        td_dtype_name(t->dtype), tensor_format_sizes(b1, sizeof b1, t->ndim, t->sizes),
                        tensor_format_sizes(b2, sizeof b2, shape.ndim, shape.d), shape.ndim, t->ndim);
    int64_t sizes[TD_MAX_DIMS], strides[TD_MAX_DIMS];
    for (int i = shape.ndim - 1; i >= 0; i--) {
        int offset = shape.ndim - 1 - i;
        int dim = t->ndim - 1 - offset;
        int64_t size = dim >= 0 ? t->sizes[dim] : 1;
        int64_t stride = dim >= 0 ? t->strides[dim] : (i + 1 < shape.ndim ? sizes[i + 1] * strides[i + 1] : 1);
        int64_t target = shape.d[i];
        if (target == -1) {
            if (dim < 0)
                return error_fmt(TD_ERR_INVALID,
                                "The expanded size of the tensor (-1) isn't allowed in a leading, non-existing "
                                "dimension %d",
                                i);
            target = size;
        }
        if (target < 0)
            return error_fmt(TD_ERR_INVALID, "Trying to create tensor with negative dimension %lld: %s",
                            (long long)target, tensor_format_sizes(b1, sizeof b1, shape.ndim, shape.d));
        if (size != target) {
            if (size != 1)
                return error_fmt(TD_ERR_INVALID,
                                "The expanded size of the tensor (%lld) must match the existing size (%lld) at "
                                "non-singleton dimension %d.  Target sizes: %s.  Tensor sizes: %s",
                                (long long)target, (long long)size, i,
                                tensor_format_sizes(b1, sizeof b1, shape.ndim, shape.d),
                                tensor_format_sizes(b2, sizeof b2, t->ndim, t->sizes));
            stride = 0;
        }
        sizes[i] = target;
        strides[i] = stride;
    }
    *out = tensor_new_view(t, t->offset, shape.ndim, sizes, strides);
    return TD_OK;
}

td_status td_tensor_unsqueeze(td_tensor *t, int dim, td_tensor **out)
{
    TD_TRY(check_args(t, out, "unsqueeze"));
    if (t->ndim >= TD_MAX_DIMS)
        return error_fmt(TD_ERR_INVALID, "unsqueeze: a tensor has at most %d dims", TD_MAX_DIMS);
    int d = 0;
    TD_TRY(tensor_wrap_dim(dim, t->ndim + 1, &d));
    int64_t sizes[TD_MAX_DIMS], strides[TD_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == d) {
            sizes[i] = 1;
            strides[i] = d >= t->ndim ? 1 : t->sizes[d] * t->strides[d];
        } else {
            sizes[i] = t->sizes[j];
            strides[i] = t->strides[j++];
        }
    }
    *out = tensor_new_view(t, t->offset, t->ndim + 1, sizes, strides);
    return TD_OK;
}

td_status td_tensor_squeeze(td_tensor *t, int dim, td_tensor **out)
{
    TD_TRY(check_args(t, out, "squeeze"));
    int d = 0;
    TD_TRY(tensor_wrap_dim(dim, t->ndim, &d));
    if (t->ndim == 0 || t->sizes[d] != 1) {
        *out = tensor_new_view(t, t->offset, t->ndim, t->sizes, t->strides);
        return TD_OK;
    }
    int64_t sizes[TD_MAX_DIMS], strides[TD_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == d)
            continue;
        sizes[n] = t->sizes[i];
        strides[n++] = t->strides[i];
    }
    *out = tensor_new_view(t, t->offset, n, sizes, strides);
    return TD_OK;
}

td_status td_tensor_flatten(td_tensor *t, td_tensor **out)
{
    TD_TRY(check_args(t, out, "flatten"));
    return td_tensor_reshape(t, TD_SHAPE(-1), out);
}

td_status td_tensor_contiguous(td_tensor *t, td_tensor **out)
{
    TD_TRY(check_args(t, out, "contiguous"));
    if (td_tensor_is_contiguous(t)) {
        *out = td_tensor_retain(t);
        return TD_OK;
    }
    return td_tensor_clone(t, out);
}

td_status td_tensor_to(const td_tensor *t, td_dtype dtype, td_tensor **out)
{
    TD_TRY(check_args(t, out, "to"));
    if (!tensor_is_host(t))
        return tensor_device_to(t, dtype, out); /* stays on its device */
    td_tensor *c;
    TD_TRY(create(dtype, td_tensor_shape(t), false, &c));
    td_strided d = strided_of(c), s = strided_of(t);
    td_status st = strided_copy(&d, &s);
    if (st != TD_OK) {
        td_tensor_release(c);
        return st;
    }
    *out = c;
    return TD_OK;
}

td_status td_tensor_clone(const td_tensor *t, td_tensor **out)
{
    TD_TRY(check_args(t, out, "clone"));
    return td_tensor_to(t, t->dtype, out);
}
