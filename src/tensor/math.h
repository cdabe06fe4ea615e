/* Internal: the compute-dtype helpers of src/tensor/math.c, shared with the autograd layer's
 * backward kernels (src/autograd/kernels.c). Floating math runs on contiguous tensors of a compute
 * dtype, float32 for float16, bfloat16 and float32, float64 for float64; the result is rounded
 * back to the input's dtype once. */
#ifndef TDIST_TENSOR_MATH_H
#define TDIST_TENSOR_MATH_H

#include <tdist/tensor.h>

/* float64 for float64, float32 for the other floating dtypes. */
td_dtype tensor_compute_dtype(td_dtype dtype);
/* TD_OK for a floating CPU tensor; otherwise TD_ERR_INVALID naming fn and the dtype. */
td_status tensor_check_floating(const td_tensor *t, const char *fn);
/* t as a contiguous tensor of its compute dtype: t itself, retained, when it already is. */
td_status tensor_as_compute(const td_tensor *t, td_tensor **out);
/* t converted to the compute dtype of dtype (contiguous, retained when it already is). */
td_status tensor_as_compute_of(const td_tensor *t, td_dtype dtype, td_tensor **out);
/* res (takes it) converted to dtype: res itself when it already has it. */
td_status tensor_from_compute(td_tensor *res, td_dtype dtype, td_tensor **out);
/* The common tail of an op: on failure (st) releases res and returns st; otherwise hands res out
 * converted to dtype (tensor_from_compute). res may be NULL on failure. */
td_status tensor_finish_compute(td_status st, td_tensor *res, td_dtype dtype, td_tensor **out);
/* The sizes around dim: outer (before), n (at dim), inner (after), with dim wrapped. */
td_status tensor_dim_split(const td_tensor *t, int dim, int *wrapped, int64_t *outer, int64_t *n, int64_t *inner);
/* embedding_bag's index arguments checked against weight [V, D] (tensor.h's rules) and resolved:
 * the indices as a contiguous 1-D int64 tensor, and each of the bags' start (a malloc'd array of
 * *bags entries; bag b ends where bag b + 1 starts, the last at the end of the indices). */
td_status tensor_embedding_bag_offsets(const td_tensor *weight, const td_tensor *indices, const td_tensor *offsets,
                                       td_tensor **idx_out, int64_t **starts_out, int64_t *bags_out);

#endif
