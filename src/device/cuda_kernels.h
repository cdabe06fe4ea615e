/* Internal: the arguments of the CUDA kernels (kernels.cu), shared by the nvcc-compiled kernels and
 * their launcher (cuda.c), which passes them by value through cuLaunchKernel. Both sides must lay
 * the structs out the same way, so only fixed-size integer fields of the C and CUDA ABIs appear. */
#ifndef TDIST_DEVICE_CUDA_KERNELS_H
#define TDIST_DEVICE_CUDA_KERNELS_H

/* Must equal DEVICE_MAX_KERNEL_DIMS (cuda.c checks); kernels.cu does not see tdist's headers. */
#define CUDA_KERNEL_MAX_DIMS 16

/* dst = src elementwise over numel elements; each side walks its own sizes and strides (elements)
 * in row-major order, so the shapes may differ as long as the element counts agree. */
typedef struct cuda_strided_args {
    unsigned long long dst;   /* device address of element 0 */
    unsigned long long src;
    long long numel;
    int dst_ndim;
    int src_ndim;
    long long dst_sizes[CUDA_KERNEL_MAX_DIMS];
    long long dst_strides[CUDA_KERNEL_MAX_DIMS];
    long long src_sizes[CUDA_KERNEL_MAX_DIMS];
    long long src_strides[CUDA_KERNEL_MAX_DIMS];
} cuda_strided_args;

/* A fill pattern of up to 16 bytes (the element's bytes from offset 0, little-endian). */
typedef struct cuda_fill_value {
    unsigned long long lo;
    unsigned long long hi;
} cuda_fill_value;

/* A random call (philox.h): the generator's (seed, offset) taken for it, the distribution
 * (PHILOX_DIST_*) and its two parameters (uniform: from, to; normal: mean, std). */
typedef struct cuda_random_args {
    unsigned long long seed;
    unsigned long long offset;
    double a;
    double b;
    int dist;
    int pad;
} cuda_random_args;

#endif
