/* tdist/tensor.h: dtypes, storages, strided tensors and the reduce kernels.
 *
 * A td_tensor is a strided view (dtype, sizes, strides in elements, offset in elements) over a
 * refcounted td_storage, as in PyTorch. Views share their storage; td_tensor_clone copies it.
 * Both handles are refcounted: functions that return a tensor or storage through an out-parameter
 * give the caller a new reference, to be dropped with td_tensor_release / td_storage_release;
 * functions that take one as an argument borrow it unless they say otherwise.
 *
 * Shapes are passed as td_shape values: td_tensor_zeros(TD_FLOAT32, TD_SHAPE(2, 3), &t).
 * Indices and sizes are int64_t; negative dims count from the end (dim -1 is the last).
 */
#ifndef TDIST_TENSOR_H
#define TDIST_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <tdist/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dtypes ------------------------------------------------------------------------------- */

typedef enum td_dtype {
    TD_BOOL = 0,
    TD_UINT8,
    TD_INT8,
    TD_INT16,
    TD_INT32,
    TD_INT64,
    TD_FLOAT16,
    TD_BFLOAT16,
    TD_FLOAT32,
    TD_FLOAT64,
    TD_COMPLEX64,
    TD_COMPLEX128,
    TD_DTYPE_COUNT
} td_dtype;

/* PyTorch's names: "bool", "uint8", ..., "float16", "bfloat16", "float32", "complex128". */
TD_API const char *td_dtype_name(td_dtype dtype);
/* Accepts the names above and the short forms f16, bf16, f32, f64, i8..i64, u8, c64, c128,
 * half, float, double, int, long. */
TD_API td_status td_dtype_from_name(const char *name, td_dtype *out);
TD_API size_t td_dtype_size(td_dtype dtype);
TD_API bool td_dtype_is_valid(int dtype);
TD_API bool td_dtype_is_floating(td_dtype dtype); /* f16, bf16, f32, f64 */
TD_API bool td_dtype_is_complex(td_dtype dtype);
TD_API bool td_dtype_is_integral(td_dtype dtype, bool include_bool);
/* torch.promote_types: the smallest dtype both convert to without losing their category. */
TD_API td_dtype td_dtype_promote(td_dtype a, td_dtype b);

/* Scalar conversions for the 16-bit float formats (round to nearest even). */
TD_API float td_half_to_float(uint16_t h);
TD_API uint16_t td_float_to_half(float f);
TD_API float td_bfloat16_to_float(uint16_t b);
TD_API uint16_t td_float_to_bfloat16(float f);

/* ---- devices ------------------------------------------------------------------------------ */

/* Where a storage lives. Only TD_DEVICE_CPU exists until the device runtime arrives; the field is
 * here so that storages, codecs and collectives carry it from the start. */
typedef enum td_device_type { TD_DEVICE_CPU = 0, TD_DEVICE_CUDA = 1, TD_DEVICE_SIM = 2 } td_device_type;
typedef struct td_device {
    td_device_type type;
    int index; /* -1 for "the current device" */
} td_device;

/* ---- storages ----------------------------------------------------------------------------- */

typedef struct td_storage td_storage;

/* A zero-filled heap storage of nbytes (64-byte aligned). */
TD_API td_status td_storage_new(size_t nbytes, td_storage **out);
/* Wraps memory the caller owns; free_fn(ctx) (may be NULL) runs when the last reference goes. */
TD_API td_status td_storage_wrap(void *data, size_t nbytes, void (*free_fn)(void *ctx), void *ctx,
                                 td_storage **out);
TD_API td_storage *td_storage_retain(td_storage *s);
TD_API void td_storage_release(td_storage *s);
TD_API void *td_storage_data(const td_storage *s);
TD_API size_t td_storage_nbytes(const td_storage *s);
TD_API td_device td_storage_device(const td_storage *s);
/* True when the storage is backed by shared memory (tdist/mp.h moves storages there). */
TD_API bool td_storage_is_shared(const td_storage *s);

/* ---- tensors ------------------------------------------------------------------------------ */

#define TD_MAX_DIMS 16

typedef struct td_shape {
    int ndim;
    int64_t d[TD_MAX_DIMS];
} td_shape;

/* TD_SHAPE(2, 3) is a 2x3 shape; TD_SHAPE_SCALAR is the 0-dim shape. */
#define TD_SHAPE(...) \
    ((td_shape){.ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), .d = {__VA_ARGS__}})
#define TD_SHAPE_SCALAR ((td_shape){.ndim = 0})
/* A shape from an array of ndim sizes. */
TD_API td_shape td_shape_of(int ndim, const int64_t *sizes);
TD_API int64_t td_shape_numel(const td_shape *shape);

typedef struct td_tensor td_tensor;

/* Creation. Every creator returns a contiguous tensor on a new storage. */
TD_API td_status td_tensor_empty(td_dtype dtype, td_shape shape, td_tensor **out);
TD_API td_status td_tensor_zeros(td_dtype dtype, td_shape shape, td_tensor **out);
TD_API td_status td_tensor_ones(td_dtype dtype, td_shape shape, td_tensor **out);
TD_API td_status td_tensor_full(td_dtype dtype, td_shape shape, double value, td_tensor **out);
/* 1-D [start, end) by step, like torch.arange. */
TD_API td_status td_tensor_arange(td_dtype dtype, double start, double end, double step, td_tensor **out);
/* Copies numel * dtype size bytes from data, laid out contiguously. */
TD_API td_status td_tensor_from_buffer(td_dtype dtype, td_shape shape, const void *data, td_tensor **out);
/* A view over an existing storage (takes no ownership of the storage: it is retained). strides may
 * be NULL for contiguous. Fails if the view would reach outside the storage. */
TD_API td_status td_tensor_from_storage(td_storage *storage, int64_t offset, td_dtype dtype, td_shape shape,
                                        const int64_t *strides, td_tensor **out);

TD_API td_tensor *td_tensor_retain(td_tensor *t);
TD_API void td_tensor_release(td_tensor *t);

/* Properties. */
TD_API td_dtype td_tensor_dtype(const td_tensor *t);
TD_API int td_tensor_ndim(const td_tensor *t);
TD_API td_shape td_tensor_shape(const td_tensor *t);
/* dim may be negative. A bad dim returns -1 with the message set; a 0-dim tensor has size and
 * stride 1 at dims 0 and -1. */
TD_API int64_t td_tensor_size(const td_tensor *t, int dim);
TD_API int64_t td_tensor_stride(const td_tensor *t, int dim);
TD_API const int64_t *td_tensor_sizes(const td_tensor *t);    /* ndim entries */
TD_API const int64_t *td_tensor_strides(const td_tensor *t);
TD_API int64_t td_tensor_numel(const td_tensor *t);
TD_API size_t td_tensor_nbytes(const td_tensor *t); /* numel * dtype size */
TD_API int64_t td_tensor_offset(const td_tensor *t); /* in elements from the storage start */
TD_API td_storage *td_tensor_storage(const td_tensor *t); /* borrowed */
TD_API bool td_tensor_is_contiguous(const td_tensor *t);
/* Address of element 0 (storage data + offset). Reading it is valid for a contiguous tensor; for
 * others, address elements with the strides. */
TD_API void *td_tensor_data(const td_tensor *t);

/* Views: share the storage. */
TD_API td_status td_tensor_view(td_tensor *t, td_shape shape, td_tensor **out);  /* -1 infers one size */
TD_API td_status td_tensor_reshape(td_tensor *t, td_shape shape, td_tensor **out); /* view, or copy if it must */
TD_API td_status td_tensor_narrow(td_tensor *t, int dim, int64_t start, int64_t length, td_tensor **out);
TD_API td_status td_tensor_select(td_tensor *t, int dim, int64_t index, td_tensor **out);
TD_API td_status td_tensor_transpose(td_tensor *t, int dim0, int dim1, td_tensor **out);
TD_API td_status td_tensor_permute(td_tensor *t, const int *dims, int ndim, td_tensor **out);
TD_API td_status td_tensor_expand(td_tensor *t, td_shape shape, td_tensor **out);
TD_API td_status td_tensor_unsqueeze(td_tensor *t, int dim, td_tensor **out);
TD_API td_status td_tensor_squeeze(td_tensor *t, int dim, td_tensor **out);
TD_API td_status td_tensor_flatten(td_tensor *t, td_tensor **out); /* 1-D; a view when possible */
/* A contiguous tensor with the same values: t itself (retained) when already contiguous. */
TD_API td_status td_tensor_contiguous(td_tensor *t, td_tensor **out);
/* A contiguous copy on a new storage. */
TD_API td_status td_tensor_clone(const td_tensor *t, td_tensor **out);
/* A contiguous copy converted to dtype. */
TD_API td_status td_tensor_to(const td_tensor *t, td_dtype dtype, td_tensor **out);

/* Data. copy converts dtypes (as PyTorch's copy_: floats to ints truncate toward zero, complex to
 * real drops the imaginary part, anything to bool is != 0) and handles any two layouts; src may be
 * broadcast to dst's shape. Overlapping src and dst give PyTorch's undefined-but-safe result. */
TD_API td_status td_tensor_copy(td_tensor *dst, const td_tensor *src);
TD_API td_status td_tensor_fill(td_tensor *t, double value);
TD_API td_status td_tensor_fill_complex(td_tensor *t, double re, double im);
/* Copies the elements, in row-major order, into / out of a contiguous buffer of nbytes. */
TD_API td_status td_tensor_read(const td_tensor *t, void *dst, size_t nbytes);
TD_API td_status td_tensor_write(td_tensor *t, const void *src, size_t nbytes);

/* Element access by a full index (ndim entries; NULL for a 0-dim tensor; negative indices count
 * from the end). Values convert from / to the tensor's dtype with copy's rules (get_f64 and
 * get_i64 of a complex tensor return the real part). */
TD_API td_status td_tensor_get_f64(const td_tensor *t, const int64_t *index, double *out);
TD_API td_status td_tensor_get_i64(const td_tensor *t, const int64_t *index, int64_t *out);
TD_API td_status td_tensor_get_complex(const td_tensor *t, const int64_t *index, double *re, double *im);
TD_API td_status td_tensor_set_f64(td_tensor *t, const int64_t *index, double value);
TD_API td_status td_tensor_set_i64(td_tensor *t, const int64_t *index, int64_t value);
TD_API td_status td_tensor_set_complex(td_tensor *t, const int64_t *index, double re, double im);

/* Comparison. equal: same shape, dtype and values (NaN != NaN, as torch.equal). allclose:
 * |a - b| <= atol + rtol * |b| elementwise with broadcasting-free equal shapes; dtypes may differ. */
TD_API bool td_tensor_equal(const td_tensor *a, const td_tensor *b);
TD_API bool td_tensor_allclose(const td_tensor *a, const td_tensor *b, double rtol, double atol, bool equal_nan);

/* Printing in PyTorch's style: "tensor([[1., 2.],\n        [3., 4.]], dtype=float64)". Long tensors
 * are summarized with "..." as PyTorch does past 1000 elements. Dtypes print without torch's
 * "torch." prefix; complex elements as "1.+2.j". The string is malloc'd. */
TD_API char *td_tensor_format(const td_tensor *t);
TD_API void td_tensor_print(FILE *f, const td_tensor *t);

/* ---- reduce kernels ----------------------------------------------------------------------- */

typedef enum td_reduce_op {
    TD_SUM = 0,
    TD_PRODUCT,
    TD_MIN,
    TD_MAX,
    TD_BAND,
    TD_BOR,
    TD_BXOR,
    TD_AVG,
    TD_PREMUL_SUM,
    TD_REDUCE_OP_COUNT
} td_reduce_op;

/* "SUM", "PRODUCT", ..., as c10d's ReduceOp prints. */
TD_API const char *td_reduce_op_name(td_reduce_op op);
TD_API td_status td_reduce_op_from_name(const char *name, td_reduce_op *out);

/* Whether op is defined for dtype: bitwise ops on integers and bool only, AVG on floating and
 * complex only, MIN/MAX not on complex. TD_ERR_INVALID with a message naming both when not. */
TD_API td_status td_reduce_check(td_reduce_op op, td_dtype dtype);

/* dst[i] = a[i] op b[i] for count elements; dst may be a or b (exactly), nothing else may overlap.
 * Buffers must be aligned to the element size (heap storages are 64-byte aligned).
 * AVG and PREMUL_SUM combine as SUM: a collective scales before (td_reduce_premul) or after
 * (td_reduce_finish). float16/bfloat16 compute in float32 and round to nearest even; MIN/MAX
 * propagate NaN. */
typedef void (*td_reduce_fn)(void *dst, const void *a, const void *b, size_t count);
/* The kernel for (op, dtype), or NULL when td_reduce_check fails (with its message set). */
TD_API td_reduce_fn td_reduce_kernel(td_reduce_op op, td_dtype dtype);
/* One call: checks, then dst = a op b. */
TD_API td_status td_reduce(td_reduce_op op, td_dtype dtype, void *dst, const void *a, const void *b, size_t count);
/* PREMUL_SUM's local step: dst[i] = src[i] * factor (floating and complex dtypes). */
TD_API td_status td_reduce_premul(td_dtype dtype, void *dst, const void *src, size_t count, double factor);
/* The last step of a reduction over world_size inputs: AVG divides by world_size; other ops do
 * nothing. */
TD_API td_status td_reduce_finish(td_reduce_op op, td_dtype dtype, void *buf, size_t count, int world_size);

/* ---- arithmetic ops (src/tensor/ops.c) ------------------------------------------------------ *
 * Elementwise arithmetic, sum, matmul and nonzero with PyTorch's semantics. Inputs are borrowed and
 * may be any strided view; each op returns a new contiguous tensor (a new reference) in *out.
 *
 * Binary ops broadcast as torch does and fail with its message ("The size of tensor a (3) must
 * match the size of tensor b (4) at non-singleton dimension 1"). The result dtype is
 * torch.result_type's: tensors with dims outrank 0-dim tensors, which outrank scalars, except that
 * an operand of a higher category (bool < integer < floating < complex) lifts the result to its
 * category: float32 tensor + float64 0-dim tensor is float32, int32 tensor + float64 0-dim tensor
 * is float64, int tensor + 2.5 is float32 (the default float dtype), float16 tensor + 2.5 stays
 * float16, int8 tensor + 3 stays int8, bool tensor + 3 is int64, float64 tensor + 1j is
 * complex128 (float16/bfloat16 + complex gives complex64: there is no complex32). div is true
 * division: integer and bool inputs give float32, as torch.div. Operands are converted to the
 * result dtype before the op (as torch's TensorIterator casts them), so an int scalar out of an
 * int8 tensor's range wraps. Integer results wrap; floating ones are computed in double and
 * rounded once to the dtype, which gives torch's float32 / float16 / bfloat16 results exactly;
 * complex64 ones are computed in complex128 (torch: in complex64), which can differ in the last
 * bit. sub with a bool operand and neg of a bool tensor fail with torch's messages. */
typedef enum td_scalar_kind { TD_SCALAR_BOOL = 0, TD_SCALAR_INT, TD_SCALAR_FLOAT, TD_SCALAR_COMPLEX } td_scalar_kind;
/* A Python number as an operand: its kind decides promotion as bool, int, float and complex do. */
typedef struct td_scalar {
    td_scalar_kind kind;
    int64_t i;     /* BOOL (0 or 1) and INT */
    double re, im; /* FLOAT (re) and COMPLEX */
} td_scalar;

static inline td_scalar td_scalar_bool(bool v)
{
    td_scalar s = {TD_SCALAR_BOOL, v ? 1 : 0, 0, 0};
    return s;
}
static inline td_scalar td_scalar_int(int64_t v)
{
    td_scalar s = {TD_SCALAR_INT, v, 0, 0};
    return s;
}
static inline td_scalar td_scalar_float(double v)
{
    td_scalar s = {TD_SCALAR_FLOAT, 0, v, 0};
    return s;
}
static inline td_scalar td_scalar_complex(double re, double im)
{
    td_scalar s = {TD_SCALAR_COMPLEX, 0, re, im};
    return s;
}

/* out = a op b, elementwise with broadcasting. eq gives a bool tensor (compared in the promoted
 * dtype). */
TD_API td_status td_tensor_add(const td_tensor *a, const td_tensor *b, td_tensor **out);
TD_API td_status td_tensor_sub(const td_tensor *a, const td_tensor *b, td_tensor **out);
TD_API td_status td_tensor_mul(const td_tensor *a, const td_tensor *b, td_tensor **out);
TD_API td_status td_tensor_div(const td_tensor *a, const td_tensor *b, td_tensor **out);
TD_API td_status td_tensor_eq(const td_tensor *a, const td_tensor *b, td_tensor **out);
/* out = a op scalar (torch.add(t, 3)). */
TD_API td_status td_tensor_add_scalar(const td_tensor *a, td_scalar b, td_tensor **out);
TD_API td_status td_tensor_sub_scalar(const td_tensor *a, td_scalar b, td_tensor **out);
TD_API td_status td_tensor_mul_scalar(const td_tensor *a, td_scalar b, td_tensor **out);
TD_API td_status td_tensor_div_scalar(const td_tensor *a, td_scalar b, td_tensor **out);
TD_API td_status td_tensor_eq_scalar(const td_tensor *a, td_scalar b, td_tensor **out);
/* The dtype td_tensor_add(a, b) gives (torch.result_type); a and b must not be NULL. */
TD_API td_dtype td_tensor_result_type(const td_tensor *a, const td_tensor *b);

/* -a, same dtype (unsigned integers wrap). */
TD_API td_status td_tensor_neg(const td_tensor *a, td_tensor **out);
/* The sum of every element as a 0-dim tensor: bool and integer inputs sum to int64 (wrapping),
 * the others keep their dtype. Floating sums accumulate in double (complex in complex128) and round
 * once at the end, so they can be more exact than torch's float32 sums, never less. */
TD_API td_status td_tensor_sum(const td_tensor *a, td_tensor **out);

/* torch.matmul for 1-D and 2-D operands of one dtype (no promotion, as torch): 1-D . 1-D is dot
 * (a 0-dim result), 2-D @ 1-D is mv, 1-D @ 2-D a vector-matrix product, 2-D @ 2-D is mm. Batched
 * (3-D and more) operands give TD_ERR_UNSUPPORTED. Accumulation is in int64 (wrapping), double or
 * complex128 by dtype, rounded once to the dtype. Shape errors carry torch's messages ("mat1 and
 * mat2 shapes cannot be multiplied (2x3 and 4x5)"). mm, mv and dot take exactly their ranks. */
TD_API td_status td_tensor_matmul(const td_tensor *a, const td_tensor *b, td_tensor **out);
TD_API td_status td_tensor_mm(const td_tensor *a, const td_tensor *b, td_tensor **out);
TD_API td_status td_tensor_mv(const td_tensor *a, const td_tensor *b, td_tensor **out);
TD_API td_status td_tensor_dot(const td_tensor *a, const td_tensor *b, td_tensor **out);

/* torch.nonzero: an int64 tensor [n, ndim] with the index of each non-zero element (NaN and
 * complex numbers with a non-zero part count), in row-major order. */
TD_API td_status td_tensor_nonzero(const td_tensor *a, td_tensor **out);

/* torch.cat(tensors, dim): the n tensors joined along dim, on their device. Device tensors work
 * too (tdist/device.h): ops follow their inputs, so the result lives on the inputs' device
 * whatever the current device is, and each input is copied into its slice on that device's
 * current stream. All inputs must be on one device ("Expected all tensors to be on the same
 * device, but found at least two devices, sim:0 and sim:1!"); the result dtype is
 * torch.promote_types over every input; it is channels_last when every input suggests it,
 * contiguous otherwise. As torch, 1-D empty tensors (shape [0]) are skipped in the shape checks
 * and in dim wrapping, 0-dim tensors are refused ("zero-dimensional tensor (at position 0) cannot
 * be concatenated"), and the other messages are PyTorch's: "torch.cat(): expected a non-empty
 * list of Tensors", "Tensors must have same number of dimensions: got 2 and 3", "Sizes of tensors
 * must match except in dimension 0. Expected size 5 but got size 4 for tensor number 1 in the
 * list.". */
TD_API td_status td_tensor_cat(const td_tensor *const *tensors, int n, int dim, td_tensor **out);


/* ---- math for the differentiable ops (src/tensor/math.c) ------------------------------------ *
 * Forward ops that tdist/autograd.h's differentiable ops build on, usable alone. They take
 * floating inputs only (float16, bfloat16, float32, float64; others fail with TD_ERR_INVALID) of
 * any layout and return a new contiguous tensor of the input's dtype. float16 and bfloat16 compute
 * in float32 and round once, as torch's CPU kernels; float32 computes in float (expf, tanhf),
 * float64 in double; sums accumulate in double. */

/* exp, log, tanh, sigmoid (1 / (1 + exp(-x))) and relu (max(x, 0), NaN kept) elementwise. */
TD_API td_status td_tensor_exp(const td_tensor *a, td_tensor **out);
TD_API td_status td_tensor_log(const td_tensor *a, td_tensor **out);
TD_API td_status td_tensor_tanh(const td_tensor *a, td_tensor **out);
TD_API td_status td_tensor_sigmoid(const td_tensor *a, td_tensor **out);
TD_API td_status td_tensor_relu(const td_tensor *a, td_tensor **out);
/* a ** exponent; pow broadcasts a and b (one floating dtype: b is converted to a's when it is
 * not, as the result dtype is a's). */
TD_API td_status td_tensor_pow_scalar(const td_tensor *a, double exponent, td_tensor **out);
TD_API td_status td_tensor_pow(const td_tensor *a, const td_tensor *b, td_tensor **out);
/* Sum and mean over one dim (negative counts from the end); keepdim keeps it with size 1.
 * td_tensor_mean is the mean of every element (a 0-dim tensor; NaN for an empty tensor). */
TD_API td_status td_tensor_sum_dim(const td_tensor *a, int dim, bool keepdim, td_tensor **out);
TD_API td_status td_tensor_mean(const td_tensor *a, td_tensor **out);
TD_API td_status td_tensor_mean_dim(const td_tensor *a, int dim, bool keepdim, td_tensor **out);
/* torch.Tensor.sum_to_size: sums a down to shape, which a's shape must broadcast from ("size {4}
 * is not expandable to size {3}" otherwise). The result is a new tensor even when nothing sums. */
TD_API td_status td_tensor_sum_to_size(const td_tensor *a, td_shape shape, td_tensor **out);
/* softmax and log_softmax along dim, max-subtracted (stable for large inputs). */
TD_API td_status td_tensor_softmax(const td_tensor *a, int dim, td_tensor **out);
TD_API td_status td_tensor_log_softmax(const td_tensor *a, int dim, td_tensor **out);
/* out = beta * bias + alpha * (a @ b): a [n, k], b [k, m] of one dtype, bias broadcastable to
 * [n, m] (torch.addmm). */
TD_API td_status td_tensor_addmm(const td_tensor *bias, const td_tensor *a, const td_tensor *b, double beta,
                                 double alpha, td_tensor **out);

typedef enum td_loss_reduction { TD_REDUCTION_MEAN = 0, TD_REDUCTION_SUM, TD_REDUCTION_NONE } td_loss_reduction;
/* torch.nn.functional.nll_loss without class weights: input [N, C] (or [C] with a 0-dim target)
 * of log-probabilities, target int64 [N] (or 0-dim) of classes in [0, C), or ignore_index, whose
 * rows count nothing (mean divides by the rows not ignored). A class out of range fails with
 * "Target 7 is out of bounds.". NONE gives [N]; MEAN and SUM a 0-dim tensor. */
TD_API td_status td_tensor_nll_loss(const td_tensor *input, const td_tensor *target, td_loss_reduction reduction,
                                    int64_t ignore_index, td_tensor **out);

typedef enum td_embedding_bag_mode { TD_EMBEDDING_BAG_SUM = 0, TD_EMBEDDING_BAG_MEAN = 1 } td_embedding_bag_mode;
/* torch.nn.functional.embedding_bag without per-sample weights: weight [V, D]; indices int64,
 * either 1-D with offsets (int64 [B], non-decreasing, starting at 0: bag b is indices
 * [offsets[b], offsets[b+1])) or 2-D [B, L] with offsets NULL (bags of L). The result is [B, D]:
 * the sum or mean of each bag's rows (an empty bag gives zeros). An index out of [0, V) fails with
 * "index 9 is out of bounds for dimension 0 with size 5". */
TD_API td_status td_tensor_embedding_bag(const td_tensor *weight, const td_tensor *indices, const td_tensor *offsets,
                                         td_embedding_bag_mode mode, td_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
