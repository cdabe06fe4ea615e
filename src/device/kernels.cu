/* The CUDA kernels of the device layer: fill, strided copy, elementwise add per dtype, the
 * Philox random fill of normal_ / uniform_ (philox.h, shared with sim.c) and the clock64() spin of
 * torch.cuda._sleep. nvcc compiles this file alone into a fatbin (sm_80, sm_90
 * and compute_90 PTX), which the build embeds into libtdist as a byte array; cuda.c loads it with
 * cuModuleLoadData on a device's first kernel launch and finds the kernels by their extern "C"
 * names. Every kernel is a grid-stride loop over 64-bit indices, so any grid covers any size. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda_kernels.h"
#include "philox.h"

/* Element types by size: 16-byte elements (complex128) are moved as two 8-byte words, so they
 * need only 8-byte alignment. */
struct __align__(8) cuda_u128 {
    unsigned long long lo, hi;
};
struct __align__(8) cuda_c64 {
    float re, im;
};
struct __align__(8) cuda_c128 {
    double re, im;
};

#define GRID_STRIDE_LOOP(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)(n); i += (int64_t)blockDim.x * gridDim.x)

template <typename T> __device__ __forceinline__ T fill_pattern(const cuda_fill_value &v);
template <> __device__ __forceinline__ uint8_t fill_pattern<uint8_t>(const cuda_fill_value &v) { return (uint8_t)v.lo; }
template <> __device__ __forceinline__ uint16_t fill_pattern<uint16_t>(const cuda_fill_value &v) { return (uint16_t)v.lo; }
template <> __device__ __forceinline__ uint32_t fill_pattern<uint32_t>(const cuda_fill_value &v) { return (uint32_t)v.lo; }
template <> __device__ __forceinline__ unsigned long long fill_pattern<unsigned long long>(const cuda_fill_value &v)
{
    return v.lo;
}
template <> __device__ __forceinline__ cuda_u128 fill_pattern<cuda_u128>(const cuda_fill_value &v)
{
    cuda_u128 r;
    r.lo = v.lo;
    r.hi = v.hi;
    return r;
}

template <typename T> __device__ void fill_impl(T *dst, unsigned long long count, cuda_fill_value value)
{
    const T pattern = fill_pattern<T>(value);
    GRID_STRIDE_LOOP(i, count) dst[i] = pattern;
}

/* The offset (elements) of the linear, row-major index i in a strided layout. */
__device__ __forceinline__ long long strided_offset(long long i, int ndim, const long long *sizes,
                                                    const long long *strides)
{
    long long offset = 0;
    for (int d = ndim - 1; d >= 0; d--) {
        long long size = sizes[d];
        long long idx = i % size;
        i /= size;
        offset += idx * strides[d];
    }
    return offset;
}

template <typename T> __device__ void strided_copy_impl(const cuda_strided_args &args)
{
    T *dst = (T *)args.dst;
    const T *src = (const T *)args.src;
    GRID_STRIDE_LOOP(i, args.numel)
    {
        long long so = strided_offset(i, args.src_ndim, args.src_sizes, args.src_strides);
        long long dofs = strided_offset(i, args.dst_ndim, args.dst_sizes, args.dst_strides);
        dst[dofs] = src[so];
    }
}

/* torch's add per dtype: integers wrap (computed unsigned, so no signed overflow), float16 and
 * bfloat16 add in float and round to nearest even (bool, logical or, is add_bool_impl). */
template <typename T> struct add_op {
    __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
template <> struct add_op<int8_t> {
    __device__ __forceinline__ int8_t operator()(int8_t a, int8_t b) const
    {
        return (int8_t)(uint8_t)((uint8_t)a + (uint8_t)b);
    }
};
template <> struct add_op<uint8_t> {
    __device__ __forceinline__ uint8_t operator()(uint8_t a, uint8_t b) const { return (uint8_t)(a + b); }
};
template <> struct add_op<int16_t> {
    __device__ __forceinline__ int16_t operator()(int16_t a, int16_t b) const
    {
        return (int16_t)(uint16_t)((uint16_t)a + (uint16_t)b);
    }
};
template <> struct add_op<int32_t> {
    __device__ __forceinline__ int32_t operator()(int32_t a, int32_t b) const
    {
        return (int32_t)((uint32_t)a + (uint32_t)b);
    }
};
template <> struct add_op<long long> {
    __device__ __forceinline__ long long operator()(long long a, long long b) const
    {
        return (long long)((unsigned long long)a + (unsigned long long)b);
    }
};
template <> struct add_op<__half> {
    __device__ __forceinline__ __half operator()(__half a, __half b) const
    {
        return __float2half_rn(__half2float(a) + __half2float(b));
    }
};
template <> struct add_op<__nv_bfloat16> {
    __device__ __forceinline__ __nv_bfloat16 operator()(__nv_bfloat16 a, __nv_bfloat16 b) const
    {
        return __float2bfloat16_rn(__bfloat162float(a) + __bfloat162float(b));
    }
};
template <> struct add_op<cuda_c64> {
    __device__ __forceinline__ cuda_c64 operator()(cuda_c64 a, cuda_c64 b) const
    {
        cuda_c64 r;
        r.re = a.re + b.re;
        r.im = a.im + b.im;
        return r;
    }
};
template <> struct add_op<cuda_c128> {
    __device__ __forceinline__ cuda_c128 operator()(cuda_c128 a, cuda_c128 b) const
    {
        cuda_c128 r;
        r.re = a.re + b.re;
        r.im = a.im + b.im;
        return r;
    }
};

/* dst may alias a or b (in-place add): each element is read before it is written, by one thread. */
template <typename T> __device__ void add_impl(T *dst, const T *a, const T *b, unsigned long long count)
{
    add_op<T> op;
    GRID_STRIDE_LOOP(i, count) dst[i] = op(a[i], b[i]);
}

/* bool is stored as one byte that may hold any non-zero value: normalize to 0 / 1 as torch does. */
__device__ void add_bool_impl(uint8_t *dst, const uint8_t *a, const uint8_t *b, unsigned long long count)
{
    GRID_STRIDE_LOOP(i, count) dst[i] = (a[i] != 0 || b[i] != 0) ? 1 : 0;
}

template <typename T> __device__ __forceinline__ T random_store(double v);
template <> __device__ __forceinline__ double random_store<double>(double v) { return v; }
template <> __device__ __forceinline__ float random_store<float>(double v) { return (float)v; }
/* Through float, as sim.c rounds (double -> float -> half, nearest even both times). */
template <> __device__ __forceinline__ __half random_store<__half>(double v) { return __float2half_rn((float)v); }
template <> __device__ __forceinline__ __nv_bfloat16 random_store<__nv_bfloat16>(double v)
{
    return __float2bfloat16_rn((float)v);
}

/* One element group (one Philox block) per loop step, so element i's value depends only on
 * (seed, offset, i), whatever the grid. */
template <typename T, int IS_DOUBLE>
__device__ void random_impl(T *dst, unsigned long long count, const cuda_random_args &args)
{
    const int per = philox_per_block(IS_DOUBLE);
    const unsigned long long groups = (count + per - 1) / per;
    GRID_STRIDE_LOOP(group, groups)
    {
        philox_block block = philox_group_block(args.seed, args.offset, (uint64_t)group);
        for (int lane = 0; lane < per; lane++) {
            unsigned long long i = (unsigned long long)group * per + lane;
            if (i < count)
                dst[i] = random_store<T>(philox_value(block, lane, IS_DOUBLE, args.dist, args.a, args.b));
        }
    }
}

extern "C" {

#define DEFINE_FILL(suffix, T)                                                                  \
    __global__ void cuda_fill_##suffix(void *dst, unsigned long long count, cuda_fill_value value) \
    {                                                                                             \
        fill_impl<T>((T *)dst, count, value);                                                     \
    }
DEFINE_FILL(1, uint8_t)
DEFINE_FILL(2, uint16_t)
DEFINE_FILL(4, uint32_t)
DEFINE_FILL(8, unsigned long long)
DEFINE_FILL(16, cuda_u128)

#define DEFINE_STRIDED_COPY(suffix, T)                                 \
    __global__ void cuda_strided_copy_##suffix(cuda_strided_args args) \
    {                                                                  \
        strided_copy_impl<T>(args);                                    \
    }
DEFINE_STRIDED_COPY(1, uint8_t)
DEFINE_STRIDED_COPY(2, uint16_t)
DEFINE_STRIDED_COPY(4, uint32_t)
DEFINE_STRIDED_COPY(8, unsigned long long)
DEFINE_STRIDED_COPY(16, cuda_u128)

#define DEFINE_ADD(suffix, T)                                                                                \
    __global__ void cuda_add_##suffix(void *dst, const void *a, const void *b, unsigned long long count)     \
    {                                                                                                        \
        add_impl<T>((T *)dst, (const T *)a, (const T *)b, count);                                            \
    }
DEFINE_ADD(uint8, uint8_t)
DEFINE_ADD(int8, int8_t)
DEFINE_ADD(int16, int16_t)
DEFINE_ADD(int32, int32_t)
DEFINE_ADD(int64, long long)
DEFINE_ADD(float16, __half)
DEFINE_ADD(bfloat16, __nv_bfloat16)
DEFINE_ADD(float32, float)
DEFINE_ADD(float64, double)
DEFINE_ADD(complex64, cuda_c64)
DEFINE_ADD(complex128, cuda_c128)

__global__ void cuda_add_bool(void *dst, const void *a, const void *b, unsigned long long count)
{
    add_bool_impl((uint8_t *)dst, (const uint8_t *)a, (const uint8_t *)b, count);
}

#define DEFINE_RANDOM(suffix, T, IS_DOUBLE)                                                            \
    __global__ void cuda_random_##suffix(void *dst, unsigned long long count, cuda_random_args args)    \
    {                                                                                                   \
        random_impl<T, IS_DOUBLE>((T *)dst, count, args);                                               \
    }
DEFINE_RANDOM(float16, __half, 0)
DEFINE_RANDOM(bfloat16, __nv_bfloat16, 0)
DEFINE_RANDOM(float32, float, 0)
DEFINE_RANDOM(float64, double, 1)

/* torch.cuda._sleep's spin: about `cycles` SM clock cycles on one thread. */
__global__ void cuda_sleep(long long cycles)
{
    const long long start = clock64();
    long long elapsed = 0;
    while (elapsed < cycles)
        elapsed = clock64() - start;
}

} /* extern "C" */
