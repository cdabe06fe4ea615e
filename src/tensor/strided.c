/* Strided layouts, below tensors and copies: shapes and their element counts, contiguous strides,
 * the td_strided descriptor of a tensor or a buffer, dim wrapping and size formatting for
 * messages. tensor.c (views) and copy.c (data movement) both build on it, so neither needs the
 * other's internals. */
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "tensor/strided.h"

td_shape td_shape_of(int ndim, const int64_t *sizes)
{
    td_shape s = {.ndim = ndim};
    for (int i = 0; i < ndim && i < TD_MAX_DIMS; i++)
        s.d[i] = sizes[i];
    return s;
}

/* Product of sizes, or -1 when a size is negative or the product overflows int64. */
int64_t td_shape_numel(const td_shape *shape)
{
    if (!shape || shape->ndim < 0 || shape->ndim > TD_MAX_DIMS)
        return -1;
    return strided_numel(shape->ndim, shape->d);
}

const char *tensor_format_sizes(char *buf, size_t len, int ndim, const int64_t *sizes)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, len - n, "[");
    for (int i = 0; i < ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)sizes[i]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
    return buf;
}

void strided_contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= sizes[i] > 1 ? sizes[i] : 1;
    }
}

td_status tensor_wrap_dim(int64_t dim, int ndim, int *out)
{
    int64_t n = ndim > 0 ? ndim : 1;
    if (dim < -n || dim >= n)
        return error_fmt(TD_ERR_INVALID, "Dimension out of range (expected to be in range of [%lld, %lld], but got %lld)",
                        (long long)-n, (long long)(n - 1), (long long)dim);
    *out = (int)(dim < 0 ? dim + n : dim);
    return TD_OK;
}

td_strided strided_of(const td_tensor *t)
{
    td_strided s = {.data = tensor_data_of(t), .dtype = t->dtype, .ndim = t->ndim};
    memcpy(s.sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
    memcpy(s.strides, t->strides, sizeof(int64_t) * (size_t)t->ndim);
    return s;
}

td_strided strided_contiguous(void *data, td_dtype dtype, int ndim, const int64_t *sizes)
{
    td_strided s = {.data = data, .dtype = dtype, .ndim = ndim};
    memcpy(s.sizes, sizes, sizeof(int64_t) * (size_t)ndim);
    strided_contiguous_strides(ndim, sizes, s.strides);
    return s;
}

td_status strided_broadcast_shape(int na, const int64_t *a, int nb, const int64_t *b, int *ndim, int64_t *out)
{
    int nd = na > nb ? na : nb;
    for (int i = nd - 1; i >= 0; i--) {
        int ai = i - (nd - na), bi = i - (nd - nb);
        int64_t as = ai >= 0 ? a[ai] : 1, bs = bi >= 0 ? b[bi] : 1;
        if (as != bs && as != 1 && bs != 1)
            return error_fmt(TD_ERR_INVALID,
                             "The size of tensor a (%lld) must match the size of tensor b (%lld) at non-singleton "
                             "dimension %d",
                             (long long)as, (long long)bs, i);
        out[i] = as == 1 ? bs : as;
    }
    *ndim = nd;
    return TD_OK;
}
