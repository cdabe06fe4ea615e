/* Internal: what the host-side tensor files (tensor.c, copy.c, ops.c, format.c) and comm.c need
 * from device_tensor.c, the tensor layer's bridge to device memory (tdist/device.h). */
#ifndef TDIST_TENSOR_DEVICE_TENSOR_H
#define TDIST_TENSOR_DEVICE_TENSOR_H

#include <stdbool.h>

#include <tdist/device.h>
#include <tdist/tensor.h>

#include "tensor/strided.h"

static inline bool tensor_is_host(const td_tensor *t) { return t->storage->device.type == TD_DEVICE_CPU; }

/* TD_OK for a CPU tensor; otherwise TD_ERR_UNSUPPORTED with "<fn> needs a CPU tensor, but got a
 * tensor on sim:1: copy it to the host first (td_tensor_to_device)". */
td_status tensor_require_host(const td_tensor *t, const char *fn);

/* A contiguous copy of a device tensor converted to dtype, on its device (td_tensor_to and
 * td_tensor_clone of a device tensor). */
/* A new tensor (version 0) of dtype on device (strides: NULL for contiguous) holding t's values,
 * copied by td_tensor_copy_ex with non_blocking. */
td_status tensor_copy_new(const td_tensor *t, td_device device, td_dtype dtype, const int64_t *strides,
                          bool non_blocking, td_tensor **out);
td_status tensor_device_to(const td_tensor *t, td_dtype dtype, td_tensor **out);

/* td_tensor_fill of a device tensor: value (of vtype, host memory) converted to t's dtype and
 * written by the implementation's fill kernel on the current stream of t's device. */
td_status tensor_device_fill(td_tensor *t, const void *value, td_dtype vtype);

/* td_tensor_add with a device operand: both on one device, one dtype and shape, contiguous (the
 * implementation's add kernel, on the device's current stream); anything else
 * TD_ERR_UNSUPPORTED. */
td_status tensor_device_add(const td_tensor *a, const td_tensor *b, td_tensor **out);
/* dst += src in place (one device, dtype and shape, both contiguous): reduce_add's accumulation. */
td_status tensor_device_add_into(td_tensor *dst, const td_tensor *src);

/* Whether the elements of t fill exactly numel consecutive elements of memory in some order of
 * dims (PyTorch's is_non_overlapping_and_dense). */
bool tensor_is_dense(const td_tensor *t);

#endif
