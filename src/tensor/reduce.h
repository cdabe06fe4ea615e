/* Internal: the reduce kernels by instruction set, for tests and benchmarks that compare the
 * baseline loops with the AVX2 ones. td_reduce_kernel (tdist/tensor.h) uses the best the CPU has. */
#ifndef TDIST_TENSOR_REDUCE_H
#define TDIST_TENSOR_REDUCE_H

#include <stdbool.h>

#include <tdist/tensor.h>

typedef enum td_reduce_isa {
    TD_REDUCE_ISA_AUTO = 0, /* the best this CPU supports */
    TD_REDUCE_ISA_BASELINE, /* the build's target ISA (SSE2 on x86-64) */
    TD_REDUCE_ISA_AVX2,     /* AVX2 + F16C, x86-64 only */
} td_reduce_isa;

bool reduce_isa_available(td_reduce_isa isa);
const char *reduce_isa_name(td_reduce_isa isa);
/* As td_reduce_kernel, for one ISA; NULL with a message when the pair is not defined or this CPU
 * (or build) lacks the ISA. */
td_reduce_fn reduce_kernel_isa(td_reduce_op op, td_dtype dtype, td_reduce_isa isa);
/* td_reduce_premul / td_reduce_finish with the loops of one ISA. */
td_status reduce_premul_isa(td_dtype dtype, void *dst, const void *src, size_t count, double factor,
                               td_reduce_isa isa);
td_status reduce_finish_isa(td_reduce_op op, td_dtype dtype, void *buf, size_t count, int world_size,
                               td_reduce_isa isa);

#endif
