/* Internal dtype helpers shared by the tensor layer: the C element types behind the complex dtypes
 * and argument checking. The public dtype API is in tdist/tensor.h. */
#ifndef TDIST_TENSOR_DTYPE_H
#define TDIST_TENSOR_DTYPE_H

#include <tdist/tensor.h>

/* complex64 and complex128 elements: real then imaginary part, as std::complex lays them out. */
typedef struct td_c64 {
    float re, im;
} td_c64;
typedef struct td_c128 {
    double re, im;
} td_c128;

/* td_dtype_size, inline (0 for an invalid dtype). */
extern const size_t dtype_sizes[TD_DTYPE_COUNT];
static inline size_t dtype_size_of(td_dtype dtype)
{
    return (unsigned)dtype < TD_DTYPE_COUNT ? dtype_sizes[dtype] : 0;
}

/* TD_OK for a valid dtype; otherwise TD_ERR_INVALID with a message naming the value. */
td_status dtype_check(int dtype);

#endif
