/* Internal: the tensor object and the strided loops that copy, compare and print share.
 *
 * A td_tensor is a view: dtype, sizes and strides (in elements) and an offset (in elements) into a
 * storage it holds a reference to. The data pointer is computed from storage->data at each access
 * and never cached, so a storage moved to shared memory (storage_swap_data) is seen by every
 * view at once.
 *
 * td_strided is the same description over a raw pointer (a tensor's current data, or a caller's
 * contiguous buffer); the copy loops work on it so that td_tensor_read/write share them. */
#ifndef TDIST_TENSOR_STRIDED_H
#define TDIST_TENSOR_STRIDED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/tensor.h>

#include "base/ref.h"
#include "tensor/dtype.h"
#include "tensor/storage.h"

/* What a higher layer hangs on one tensor object (autograd's metadata, src/autograd): the tensor
 * layer only frees it, through its own function, when the tensor goes. Views do not inherit it. */
typedef struct tensor_ext {
    void (*free)(struct tensor_ext *ext);
} tensor_ext;

/* The autograd facts of one tensor object that travel with it between processes (mp, which sits
 * between this layer and autograd, reads and sets them), as bits of td_tensor.grad_flags. The rest
 * of autograd's state (.grad, grad_fn, hooks) stays in the extension above and never travels.
 * Views and copies do not inherit them. */
#define TENSOR_REQUIRES_GRAD 1u /* a leaf that requires grad: autograd's own flag, not a copy */
#define TENSOR_NON_LEAF 2u      /* made by a recorded op: set once, by autograd, with its grad_fn */
#define TENSOR_PARAMETER 4u     /* the kind: an nn.Parameter rather than a plain tensor */

struct td_tensor {
    td_ref refcount;
    td_storage *storage; /* retained */
    int64_t offset;      /* elements */
    td_dtype dtype;
    int ndim;
    int64_t sizes[TD_MAX_DIMS];
    int64_t strides[TD_MAX_DIMS]; /* elements */
    tensor_ext *autograd;         /* NULL until autograd attaches its metadata (set once, atomically) */
    uint32_t grad_flags;          /* TENSOR_* bits above; read and written atomically (below) */
};

static inline uint32_t tensor_grad_flags(const td_tensor *t)
{
    return __atomic_load_n(&t->grad_flags, __ATOMIC_ACQUIRE);
}
/* All the flags of a tensor nobody else sees yet, in one store (never a state between two). */
static inline void tensor_init_grad_flags(td_tensor *t, uint32_t flags)
{
    __atomic_store_n(&t->grad_flags, flags, __ATOMIC_RELEASE);
}
/* Sets (on) or clears the given bits, leaving the others. */
static inline void tensor_update_grad_flags(td_tensor *t, uint32_t bits, bool on)
{
    if (on)
        __atomic_fetch_or(&t->grad_flags, bits, __ATOMIC_ACQ_REL);
    else
        __atomic_fetch_and(&t->grad_flags, ~bits, __ATOMIC_ACQ_REL);
}

/* Elements of a shape; -1 for a negative size or an overflow. */
static inline int64_t strided_numel(int ndim, const int64_t *sizes)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (sizes[i] < 0 || __builtin_mul_overflow(n, sizes[i], &n))
            return -1;
    }
    return n;
}

/* Whether sizes and strides lay the elements out densely in row-major order (sizes of 1 and empty
 * shapes impose nothing). */
static inline bool strided_is_contiguous(int ndim, const int64_t *sizes, const int64_t *strides)
{
    int64_t expected = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (sizes[i] == 0)
            return true;
    }
    for (int i = ndim - 1; i >= 0; i--) {
        if (sizes[i] == 1)
            continue;
        if (strides[i] != expected)
            return false;
        expected *= sizes[i];
    }
    return true;
}

/* td_tensor_data, inline for the library's hot paths (a collective handed straight to its
 * backend: pg/collectives.c), as td_tensor_numel and td_tensor_is_contiguous are through the two
 * above. */
static inline void *tensor_data_of(const td_tensor *t)
{
    char *base = t->storage->data;
    if (!base)
        return NULL;
    return base + t->offset * (int64_t)dtype_size_of(t->dtype);
}

/* Whether two tensors have the same sizes (dtype, strides and device aside). */
static inline bool strided_same_sizes(const td_tensor *a, const td_tensor *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++) {
        if (a->sizes[i] != b->sizes[i])
            return false;
    }
    return true;
}

typedef struct td_strided {
    char *data; /* element 0 */
    td_dtype dtype;
    int ndim;
    int64_t sizes[TD_MAX_DIMS];
    int64_t strides[TD_MAX_DIMS]; /* elements */
} td_strided;

/* The tensor as a td_strided over its storage's current data. */
td_strided strided_of(const td_tensor *t);
/* Row-major strides for sizes (a size-0 or size-1 dim counts as 1, as in PyTorch). */
void strided_contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides);
/* A contiguous td_strided over a caller's buffer. */
td_strided strided_contiguous(void *data, td_dtype dtype, int ndim, const int64_t *sizes);

/* dst = src converted (PyTorch's copy_ rules) with src broadcast to dst's shape. Handles
 * overlapping operands by staging src through a temporary copy. */
td_status strided_copy(const td_strided *dst, const td_strided *src);

/* The shape that sizes a (na dims) and b (nb dims) broadcast to (at::infer_size): *ndim dims into
 * out. Fails with PyTorch's "The size of tensor a (3) must match the size of tensor b (4) at
 * non-singleton dimension 1" when they do not fit. */
td_status strided_broadcast_shape(int na, const int64_t *a, int nb, const int64_t *b, int *ndim, int64_t *out);

/* A view: a new tensor on t's storage (retained) with the given geometry. */
td_tensor *tensor_new_view(const td_tensor *t, int64_t offset, int ndim, const int64_t *sizes,
                              const int64_t *strides);
/* Wraps dim into [0, ndim) or fails with PyTorch's "Dimension out of range" message. A 0-dim
 * tensor accepts dims -1 and 0, as in PyTorch. */
td_status tensor_wrap_dim(int64_t dim, int ndim, int *out);
/* "[2, 3]" into buf. */
const char *tensor_format_sizes(char *buf, size_t len, int ndim, const int64_t *sizes);

/* Converts one element from one dtype to another (PyTorch's conversion rules). */
void tensor_convert_element(void *dst, td_dtype dst_dtype, const void *src, td_dtype src_dtype);

#endif
