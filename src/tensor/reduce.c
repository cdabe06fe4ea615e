/* The reduce kernels: dst[i] = a[i] op b[i] for every (op, dtype) pair c10d defines, plus the
 * scaling steps of PREMUL_SUM (td_reduce_premul) and AVG (td_reduce_finish).
 *
 * These are the inner loops of every collective backend, so they must run at memory bandwidth.
 * This file is built with -O3 (src/CMakeLists.txt) and each loop is written for gcc's
 * auto-vectorizer: a plain indexed loop over restrict pointers with a branch-free body (MIN/MAX
 * select with compares, NaN propagation included; float16/bfloat16 convert with the branch-free
 * routines of half.h). docs/performance.md ("Reduce kernels") lists which loops vectorize and the
 * GB/s they reach.
 *
 * dst may be a or b. So that the restrict qualifiers are true, each kernel has four loops and a
 * dispatcher picks one: out of place (dst, a, b distinct), in place on the left (dst == a) or on
 * the right (dst == b), and a plain loop for dst == a == b.
 *
 * Semantics follow PyTorch: integer arithmetic wraps (done in unsigned types, so there is no UB);
 * bool SUM is logical OR and PRODUCT logical AND; MIN/MAX return NaN when either input is NaN
 * (torch.minimum/maximum); float16/bfloat16 combine in float32 and round back to nearest even at
 * each call; complex PRODUCT is the schoolbook product (c10::complex). */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "base/error.h"
#include "tensor/dtype.h"
#include "tensor/half.h"
#include "tensor/reduce.h"

/* ---- element operations ---------------------------------------------------------------------- */

/* Each operation is one branch-free expression of its operands x and y (T: element type, U: the
 * type the arithmetic runs in). */
#define OP_SUM(T, U, x, y) ((T)((U)(x) + (U)(y)))
#define OP_PROD(T, U, x, y) ((T)((U)(x) * (U)(y)))
#define OP_MIN_INT(T, U, x, y) ((x) < (y) ? (x) : (y))
#define OP_MAX_INT(T, U, x, y) ((x) > (y) ? (x) : (y))
#define OP_BAND(T, U, x, y) ((T)((x) & (y)))
#define OP_BOR(T, U, x, y) ((T)((x) | (y)))
#define OP_BXOR(T, U, x, y) ((T)((x) ^ (y)))

#define OP_FSUM(T, U, x, y) ((x) + (y))
#define OP_FPROD(T, U, x, y) ((x) * (y))
/* NaN in either operand gives NaN: x != x is the NaN test, and a NaN y falls through the compare. */
#define OP_FMIN(T, U, x, y) (((x) < (y) || (x) != (x)) ? (x) : (y))
#define OP_FMAX(T, U, x, y) (((x) > (y) || (x) != (x)) ? (x) : (y))

/* bool elements are bytes holding 0 or 1; results are normalized to 0 or 1 whatever the inputs. */
#define OP_LOR(T, U, x, y) ((T)(((x) | (y)) != 0))
#define OP_LAND(T, U, x, y) ((T)(((x) != 0) & ((y) != 0)))
#define OP_LXOR(T, U, x, y) ((T)(((x) != 0) ^ ((y) != 0)))

/* float16 / bfloat16: widen, combine in float32, round back. */
#define OP_HSUM(T, U, x, y) f2h(OP_FSUM(float, float, h2f(x), h2f(y)))
#define OP_HPROD(T, U, x, y) f2h(OP_FPROD(float, float, h2f(x), h2f(y)))
#define OP_HMIN(T, U, x, y) f2h(OP_FMIN(float, float, h2f(x), h2f(y)))
#define OP_HMAX(T, U, x, y) f2h(OP_FMAX(float, float, h2f(x), h2f(y)))
#define OP_BSUM(T, U, x, y) f2bf(OP_FSUM(float, float, bf2f(x), bf2f(y)))
#define OP_BPROD(T, U, x, y) f2bf(OP_FPROD(float, float, bf2f(x), bf2f(y)))
#define OP_BMIN(T, U, x, y) f2bf(OP_FMIN(float, float, bf2f(x), bf2f(y)))
#define OP_BMAX(T, U, x, y) f2bf(OP_FMAX(float, float, bf2f(x), bf2f(y)))

#define OP_CSUM(T, U, x, y) ((T){(x).re + (y).re, (x).im + (y).im})
#define OP_CPROD(T, U, x, y) ((T){(x).re * (y).re - (x).im * (y).im, (x).re * (y).im + (x).im * (y).re})

/* ---- kernel generator ------------------------------------------------------------------------ */

/* Every kernel is built twice: for the baseline ISA (x86-64's SSE2) and for AVX2, picked at run
 * time by the CPU (reduce_kernel_isa). No FMA in the AVX2 target: fused multiply-adds would
 * round complex products differently from the baseline build, and ranks must agree. */
#if defined(__x86_64__)
#define TD_HAVE_AVX2_KERNELS 1
#define TD_AVX2 __attribute__((target("avx2")))
#define TD_F16C __attribute__((target("avx2,f16c")))
#include <cpuid.h>
#include <immintrin.h>
#else
#define TD_HAVE_AVX2_KERNELS 0
#define TD_AVX2
#endif

#define DEF_LOOPS(name, T, sfx, ATTR)                                                                \
    ATTR static void oop_##name##sfx(T *restrict d, const T *restrict a, const T *restrict b, size_t n) \
    {                                                                                                \
        for (size_t i = 0; i < n; i++)                                                               \
            d[i] = elem_##name(a[i], b[i]);                                                          \
    }                                                                                                \
    ATTR static void left_##name##sfx(T *restrict d, const T *restrict b, size_t n)                  \
    {                                                                                                \
        for (size_t i = 0; i < n; i++)                                                               \
            d[i] = elem_##name(d[i], b[i]);                                                          \
    }                                                                                                \
    ATTR static void right_##name##sfx(T *restrict d, const T *restrict a, size_t n)                 \
    {                                                                                                \
        for (size_t i = 0; i < n; i++)                                                               \
            d[i] = elem_##name(a[i], d[i]);                                                          \
    }                                                                                                \
    static void kernel_##name##sfx(void *dst, const void *a, const void *b, size_t n)                \
    {                                                                                                \
        if (dst == a && dst == b)                                                                    \
            self_##name(dst, n);                                                                     \
        else if (dst == a)                                                                           \
            left_##name##sfx(dst, b, n);                                                             \
        else if (dst == b)                                                                           \
            right_##name##sfx(dst, a, n);                                                            \
        else                                                                                         \
            oop_##name##sfx(dst, a, b, n);                                                           \
    }

/* The element operation, the dst == a == b loop (rare: no restrict, one build), and the baseline
 * loops. */
#define DEF_KERNEL_BASE(name, T, U, OP)                                                              \
    static inline T elem_##name(T x, T y) { return OP(T, U, x, y); }                                 \
    static void self_##name(T *d, size_t n)                                                          \
    {                                                                                                \
        for (size_t i = 0; i < n; i++)                                                               \
            d[i] = elem_##name(d[i], d[i]);                                                          \
    }                                                                                                \
    DEF_LOOPS(name, T, , )

#if TD_HAVE_AVX2_KERNELS
#define DEF_KERNEL(name, T, U, OP) DEF_KERNEL_BASE(name, T, U, OP) DEF_LOOPS(name, T, _avx2, TD_AVX2)
#else
#define DEF_KERNEL(name, T, U, OP) DEF_KERNEL_BASE(name, T, U, OP)
#endif

/* Integer dtypes: the unsigned type U is at least as wide as int, so that the arithmetic neither
 * overflows a signed type nor is promoted to one. */
#define DEF_INT_KERNELS(tag, T, U)              \
    DEF_KERNEL(sum_##tag, T, U, OP_SUM)         \
    DEF_KERNEL(prod_##tag, T, U, OP_PROD)       \
    DEF_KERNEL(min_##tag, T, U, OP_MIN_INT)     \
    DEF_KERNEL(max_##tag, T, U, OP_MAX_INT)     \
    DEF_KERNEL(band_##tag, T, U, OP_BAND)       \
    DEF_KERNEL(bor_##tag, T, U, OP_BOR)         \
    DEF_KERNEL(bxor_##tag, T, U, OP_BXOR)
DEF_INT_KERNELS(u8, uint8_t, unsigned)
DEF_INT_KERNELS(i8, int8_t, unsigned)
DEF_INT_KERNELS(i16, int16_t, unsigned)
DEF_INT_KERNELS(i32, int32_t, uint32_t)
DEF_INT_KERNELS(i64, int64_t, uint64_t)

DEF_KERNEL(lor_b8, uint8_t, unsigned, OP_LOR)
DEF_KERNEL(land_b8, uint8_t, unsigned, OP_LAND)
DEF_KERNEL(lxor_b8, uint8_t, unsigned, OP_LXOR)

#define DEF_FLOAT_KERNELS(tag, T)             \
    DEF_KERNEL(sum_##tag, T, T, OP_FSUM)      \
    DEF_KERNEL(prod_##tag, T, T, OP_FPROD)    \
    DEF_KERNEL(min_##tag, T, T, OP_FMIN)      \
    DEF_KERNEL(max_##tag, T, T, OP_FMAX)
DEF_FLOAT_KERNELS(f32, float)
DEF_FLOAT_KERNELS(f64, double)

/* float16 on AVX2 machines converts with F16C (vcvtph2ps / vcvtps2ph, round to nearest even), which
 * gcc does not generate from half.h's bit manipulation: the baseline loop is compute-bound, this
 * one runs at memory speed. It reads each block before writing it, so dst may be a
 * or b without separate loops; the tail uses the scalar conversion, which rounds the same way. */
DEF_KERNEL_BASE(sum_f16, uint16_t, float, OP_HSUM)
DEF_KERNEL_BASE(prod_f16, uint16_t, float, OP_HPROD)
DEF_KERNEL_BASE(min_f16, uint16_t, float, OP_HMIN)
DEF_KERNEL_BASE(max_f16, uint16_t, float, OP_HMAX)

#if TD_HAVE_AVX2_KERNELS
/* Same selects as OP_FMIN / OP_FMAX: min_ps(x, y) is x < y ? x : y, then a NaN x wins. */
#define V_SUM(x, y) _mm256_add_ps(x, y)
#define V_PROD(x, y) _mm256_mul_ps(x, y)
#define V_MIN(x, y) _mm256_blendv_ps(_mm256_min_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q))
#define V_MAX(x, y) _mm256_blendv_ps(_mm256_max_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q))
#define DEF_F16C_KERNEL(name, VOP)                                                                   \
    TD_F16C static void kernel_##name##_avx2(void *dst, const void *va, const void *vb, size_t n)   \
    {                                                                                                \
        uint16_t *d = dst;                                                                           \
        const uint16_t *a = va, *b = vb;                                                             \
        size_t i = 0;                                                                                \
        for (; i + 8 <= n; i += 8) {                                                                 \
            __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i)));                   \
            __m256 y = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));                   \
            __m128i r = _mm256_cvtps_ph(VOP(x, y), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);  \
            _mm_storeu_si128((__m128i *)(d + i), r);                                                 \
        }                                                                                            \
        for (; i < n; i++)                                                                           \
            d[i] = elem_##name(a[i], b[i]);                                                          \
    }
DEF_F16C_KERNEL(sum_f16, V_SUM)
DEF_F16C_KERNEL(prod_f16, V_PROD)
DEF_F16C_KERNEL(min_f16, V_MIN)
DEF_F16C_KERNEL(max_f16, V_MAX)
#endif
/* bfloat16 on AVX2 machines: the same widening and rounding as half.h, written with intrinsics;
 * gcc's vectorization of the scalar code is compute-bound at about half the memory bandwidth. */
DEF_KERNEL_BASE(sum_bf16, uint16_t, float, OP_BSUM)
DEF_KERNEL_BASE(prod_bf16, uint16_t, float, OP_BPROD)
DEF_KERNEL_BASE(min_bf16, uint16_t, float, OP_BMIN)
DEF_KERNEL_BASE(max_bf16, uint16_t, float, OP_BMAX)

#if TD_HAVE_AVX2_KERNELS
/* f2bf on 8 lanes, leaving the bfloat16 in the low half of each 32-bit lane: add 0x7FFF plus
 * the lowest kept bit and keep the top half; NaN -> 0x7FC0. */
TD_AVX2 static inline __m256i bf16x8_round(__m256 v)
{
    __m256i w = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(w, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(w, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
}

/* 16 elements per step. Interleaving zeros below each bfloat16 (unpacklo/hi within 128-bit lanes)
 * widens it to float32 in one instruction, and packus undoes exactly that lane order, so no
 * cross-lane shuffles are needed. */
#define DEF_BF16_KERNEL(name, VOP)                                                                   \
    TD_AVX2 static void kernel_##name##_avx2(void *dst, const void *va, const void *vb, size_t n)    \
    {                                                                                                \
        uint16_t *d = dst;                                                                           \
        const uint16_t *a = va, *b = vb;                                                             \
        const __m256i zero = _mm256_setzero_si256();                                                 \
        size_t i = 0;                                                                                \
        for (; i + 16 <= n; i += 16) {                                                               \
            __m256i x = _mm256_loadu_si256((const __m256i *)(a + i));                                \
            __m256i y = _mm256_loadu_si256((const __m256i *)(b + i));                                \
            __m256 xlo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x));                        \
            __m256 xhi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x));                        \
            __m256 ylo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, y));                        \
            __m256 yhi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, y));                        \
            __m256i r = _mm256_packus_epi32(bf16x8_round(VOP(xlo, ylo)), bf16x8_round(VOP(xhi, yhi))); \
            _mm256_storeu_si256((__m256i *)(d + i), r);                                              \
        }                                                                                            \
        for (; i < n; i++)                                                                           \
            d[i] = elem_##name(a[i], b[i]);                                                          \
    }
DEF_BF16_KERNEL(sum_bf16, V_SUM)
DEF_BF16_KERNEL(prod_bf16, V_PROD)
DEF_BF16_KERNEL(min_bf16, V_MIN)
DEF_BF16_KERNEL(max_bf16, V_MAX)
#endif

DEF_KERNEL(sum_c64, td_c64, float, OP_CSUM)
DEF_KERNEL(prod_c64, td_c64, float, OP_CPROD)
DEF_KERNEL(sum_c128, td_c128, double, OP_CSUM)
DEF_KERNEL(prod_c128, td_c128, double, OP_CPROD)

/* ---- dispatch -------------------------------------------------------------------------------- */

/* Rows in td_reduce_op order (AVG and PREMUL_SUM reduce as SUM), columns in td_dtype order; NULL
 * where the pair is not defined. One table per ISA. */
#define KERNEL_TABLE(x)                                                                                         \
    {                                                                                                           \
        [TD_SUM] = {kernel_lor_b8##x, kernel_sum_u8##x, kernel_sum_i8##x, kernel_sum_i16##x, kernel_sum_i32##x,    \
                    kernel_sum_i64##x, kernel_sum_f16##x, kernel_sum_bf16##x, kernel_sum_f32##x, kernel_sum_f64##x, \
                    kernel_sum_c64##x, kernel_sum_c128##x},                                                     \
        [TD_PRODUCT] = {kernel_land_b8##x, kernel_prod_u8##x, kernel_prod_i8##x, kernel_prod_i16##x,              \
                        kernel_prod_i32##x, kernel_prod_i64##x, kernel_prod_f16##x, kernel_prod_bf16##x,          \
                        kernel_prod_f32##x, kernel_prod_f64##x, kernel_prod_c64##x, kernel_prod_c128##x},         \
        [TD_MIN] = {kernel_land_b8##x, kernel_min_u8##x, kernel_min_i8##x, kernel_min_i16##x, kernel_min_i32##x,   \
                    kernel_min_i64##x, kernel_min_f16##x, kernel_min_bf16##x, kernel_min_f32##x, kernel_min_f64##x, \
                    NULL, NULL},                                                                                \
        [TD_MAX] = {kernel_lor_b8##x, kernel_max_u8##x, kernel_max_i8##x, kernel_max_i16##x, kernel_max_i32##x,    \
                    kernel_max_i64##x, kernel_max_f16##x, kernel_max_bf16##x, kernel_max_f32##x, kernel_max_f64##x, \
                    NULL, NULL},                                                                                \
        [TD_BAND] = {kernel_land_b8##x, kernel_band_u8##x, kernel_band_i8##x, kernel_band_i16##x,                 \
                     kernel_band_i32##x, kernel_band_i64##x},                                                   \
        [TD_BOR] = {kernel_lor_b8##x, kernel_bor_u8##x, kernel_bor_i8##x, kernel_bor_i16##x, kernel_bor_i32##x,    \
                    kernel_bor_i64##x},                                                                         \
        [TD_BXOR] = {kernel_lxor_b8##x, kernel_bxor_u8##x, kernel_bxor_i8##x, kernel_bxor_i16##x,                 \
                     kernel_bxor_i32##x, kernel_bxor_i64##x},                                                   \
        [TD_AVG] = {[TD_FLOAT16] = kernel_sum_f16##x, kernel_sum_bf16##x, kernel_sum_f32##x, kernel_sum_f64##x,   \
                    kernel_sum_c64##x, kernel_sum_c128##x},                                                     \
        [TD_PREMUL_SUM] = {[TD_FLOAT16] = kernel_sum_f16##x, kernel_sum_bf16##x, kernel_sum_f32##x,               \
                           kernel_sum_f64##x, kernel_sum_c64##x, kernel_sum_c128##x},                           \
    }

static const td_reduce_fn kernels[TD_REDUCE_OP_COUNT][TD_DTYPE_COUNT] = KERNEL_TABLE();
#if TD_HAVE_AVX2_KERNELS
static const td_reduce_fn kernels_avx2[TD_REDUCE_OP_COUNT][TD_DTYPE_COUNT] = KERNEL_TABLE(_avx2);
#endif

static const char *const op_names[TD_REDUCE_OP_COUNT] = {
    "SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM",
};

const char *td_reduce_op_name(td_reduce_op op)
{
    return (int)op >= 0 && op < TD_REDUCE_OP_COUNT ? op_names[op] : "INVALID_REDUCE_OP";
}

td_status td_reduce_op_from_name(const char *name, td_reduce_op *out)
{
    if (!name)
        return error_fmt(TD_ERR_INVALID, "reduce op name is NULL");
    const char *n = strncmp(name, "ReduceOp.", 9) == 0 ? name + 9 : name;
    for (int i = 0; i < TD_REDUCE_OP_COUNT; i++) {
        if (strcasecmp(n, op_names[i]) == 0) {
            *out = (td_reduce_op)i;
            return TD_OK;
        }
    }
    if (strcasecmp(n, "PROD") == 0) {
        *out = TD_PRODUCT;
        return TD_OK;
    }
    return error_fmt(TD_ERR_INVALID,
                    "unknown reduce op '%s': expected one of SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR, AVG, PREMUL_SUM",
                    name);
}

td_status td_reduce_check(td_reduce_op op, td_dtype dtype)
{
    if ((int)op < 0 || op >= TD_REDUCE_OP_COUNT)
        return error_fmt(TD_ERR_INVALID, "invalid reduce op %d (expected a td_reduce_op from 0 to %d)", (int)op,
                        TD_REDUCE_OP_COUNT - 1);
    TD_TRY(dtype_check((int)dtype));
    if (kernels[op][dtype])
        return TD_OK;
    switch (op) {
    case TD_BAND:
    case TD_BOR:
    case TD_BXOR:
        return error_fmt(TD_ERR_INVALID,
                        "reduce op %s is not supported for dtype %s (bitwise ops need an integer or bool dtype)",
                        op_names[op], td_dtype_name(dtype));
    case TD_MIN:
    case TD_MAX:
        return error_fmt(TD_ERR_INVALID, "reduce op %s is not supported for dtype %s (complex numbers are not ordered)",
                        op_names[op], td_dtype_name(dtype));
    default:
        return error_fmt(TD_ERR_INVALID,
                        "reduce op %s is not supported for dtype %s (%s needs a floating point or complex dtype)",
                        op_names[op], td_dtype_name(dtype), op_names[op]);
    }
}

#if TD_HAVE_AVX2_KERNELS
/* AVX2 (which __builtin_cpu_supports also checks the OS enables) and F16C (CPUID.1:ECX bit 29;
 * clang's __builtin_cpu_supports does not know "f16c"). Cached: this runs at every kernel lookup. */
static bool cpu_has_avx2_f16c(void)
{
    static atomic_int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        unsigned eax, ebx, ecx = 0, edx;
        bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
        v = __builtin_cpu_supports("avx2") && f16c;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}
#endif

bool reduce_isa_available(td_reduce_isa isa)
{
    switch (isa) {
    case TD_REDUCE_ISA_AUTO:
    case TD_REDUCE_ISA_BASELINE: return true;
    case TD_REDUCE_ISA_AVX2:
#if TD_HAVE_AVX2_KERNELS
        return cpu_has_avx2_f16c();
#else
        return false;
#endif
    }
    return false;
}

const char *reduce_isa_name(td_reduce_isa isa)
{
    switch (isa) {
    case TD_REDUCE_ISA_AUTO: return "auto";
    case TD_REDUCE_ISA_BASELINE: return "baseline";
    case TD_REDUCE_ISA_AVX2: return "avx2";
    }
    return "invalid";
}

td_reduce_fn reduce_kernel_isa(td_reduce_op op, td_dtype dtype, td_reduce_isa isa)
{
    if (td_reduce_check(op, dtype) != TD_OK)
        return NULL;
    if (isa == TD_REDUCE_ISA_AUTO)
        isa = reduce_isa_available(TD_REDUCE_ISA_AVX2) ? TD_REDUCE_ISA_AVX2 : TD_REDUCE_ISA_BASELINE;
    if (!reduce_isa_available(isa)) {
        error_fmt(TD_ERR_UNSUPPORTED, "the %s reduce kernels are not available on this CPU or build",
                 reduce_isa_name(isa));
        return NULL;
    }
#if TD_HAVE_AVX2_KERNELS
    if (isa == TD_REDUCE_ISA_AVX2)
        return kernels_avx2[op][dtype];
#endif
    return kernels[op][dtype];
}

td_reduce_fn td_reduce_kernel(td_reduce_op op, td_dtype dtype)
{
    return reduce_kernel_isa(op, dtype, TD_REDUCE_ISA_AUTO);
}

td_status td_reduce(td_reduce_op op, td_dtype dtype, void *dst, const void *a, const void *b, size_t count)
{
    td_reduce_fn fn = td_reduce_kernel(op, dtype);
    if (!fn)
        return TD_ERR_INVALID;
    if (count && (!dst || !a || !b))
        return error_fmt(TD_ERR_INVALID, "td_reduce: a NULL buffer for %zu elements", count);
    fn(dst, a, b, count);
    return TD_OK;
}

/* ---- scaling: PREMUL_SUM's premultiply, AVG's divide -------------------------------------- */

/* dst[i] = src[i] * f, dst == src allowed (so no restrict: gcc checks the overlap at run time). */
#define DEF_SCALE(tag, T, F, LOAD, STORE)                                        \
    static void scale_##tag(T *d, const T *s, size_t n, F f)                     \
    {                                                                            \
        for (size_t i = 0; i < n; i++)                                           \
            d[i] = STORE(LOAD(s[i]) * f);                                        \
    }                                                                            \
    static void divide_##tag(T *d, size_t n, F f)                                \
    {                                                                            \
        for (size_t i = 0; i < n; i++)                                           \
            d[i] = STORE(LOAD(d[i]) / f);                                        \
    }
#define SAME(v) (v)
DEF_SCALE(f16, uint16_t, float, h2f, f2h)
DEF_SCALE(bf16, uint16_t, float, bf2f, f2bf)
DEF_SCALE(f32, float, float, SAME, SAME)
DEF_SCALE(f64, double, double, SAME, SAME)

#if TD_HAVE_AVX2_KERNELS
/* The 16-bit scalings with F16C / AVX2, as the kernels above (same rounding: one product or
 * quotient in float32, then to nearest even). dst == src is fine: each block is read before it
 * is written. */
TD_F16C static void scale16_f16_avx2(uint16_t *d, const uint16_t *s, size_t n, float f, bool divide)
{
    const __m256 vf = _mm256_set1_ps(f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i)));
        x = divide ? _mm256_div_ps(x, vf) : _mm256_mul_ps(x, vf);
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; i++)
        d[i] = f2h(divide ? h2f(s[i]) / f : h2f(s[i]) * f);
}

TD_AVX2 static void scale16_bf16_avx2(uint16_t *d, const uint16_t *s, size_t n, float f, bool divide)
{
    const __m256 vf = _mm256_set1_ps(f);
    const __m256i zero = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256 lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x));
        __m256 hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x));
        lo = divide ? _mm256_div_ps(lo, vf) : _mm256_mul_ps(lo, vf);
        hi = divide ? _mm256_div_ps(hi, vf) : _mm256_mul_ps(hi, vf);
        _mm256_storeu_si256((__m256i *)(d + i), _mm256_packus_epi32(bf16x8_round(lo), bf16x8_round(hi)));
    }
    for (; i < n; i++)
        d[i] = f2bf(divide ? bf2f(s[i]) / f : bf2f(s[i]) * f);
}
#endif

/* Complex elements scale as two reals each. */
static td_status scale(td_dtype dtype, void *dst, const void *src, size_t count, double factor, bool divide,
                       td_reduce_isa isa)
{
    bool avx2 = isa == TD_REDUCE_ISA_AVX2 || (isa == TD_REDUCE_ISA_AUTO && reduce_isa_available(TD_REDUCE_ISA_AVX2));
    (void)avx2;
    switch (dtype) {
    case TD_COMPLEX64: count *= 2; /* fall through */
    case TD_FLOAT32:
        divide ? divide_f32(dst, count, (float)factor) : scale_f32(dst, src, count, (float)factor);
        break;
    case TD_COMPLEX128: count *= 2; /* fall through */
    case TD_FLOAT64:
        divide ? divide_f64(dst, count, factor) : scale_f64(dst, src, count, factor);
        break;
    case TD_FLOAT16:
#if TD_HAVE_AVX2_KERNELS
        if (avx2) {
            scale16_f16_avx2(dst, src, count, (float)factor, divide);
            break;
        }
#endif
        divide ? divide_f16(dst, count, (float)factor) : scale_f16(dst, src, count, (float)factor);
        break;
    case TD_BFLOAT16:
#if TD_HAVE_AVX2_KERNELS
        if (avx2) {
            scale16_bf16_avx2(dst, src, count, (float)factor, divide);
            break;
        }
#endif
        divide ? divide_bf16(dst, count, (float)factor) : scale_bf16(dst, src, count, (float)factor);
        break;
    default:
        return error_fmt(TD_ERR_INTERNAL, "scale: unexpected dtype %s", td_dtype_name(dtype));
    }
    return TD_OK;
}

static td_status check_isa(td_reduce_isa isa)
{
    if (!reduce_isa_available(isa))
        return error_fmt(TD_ERR_UNSUPPORTED, "the %s reduce kernels are not available on this CPU or build",
                        reduce_isa_name(isa));
    return TD_OK;
}

td_status reduce_premul_isa(td_dtype dtype, void *dst, const void *src, size_t count, double factor,
                               td_reduce_isa isa)
{
    TD_TRY(check_isa(isa));
    TD_TRY(td_reduce_check(TD_PREMUL_SUM, dtype));
    if (count && (!dst || !src))
        return error_fmt(TD_ERR_INVALID, "td_reduce_premul: a NULL buffer for %zu elements", count);
    if (count && dst != src) {
        /* Partial overlap would make the result depend on the loop order. */
        size_t bytes = count * td_dtype_size(dtype);
        const char *d = dst, *s = src;
        if (d < s + bytes && s < d + bytes)
            return error_fmt(TD_ERR_INVALID, "td_reduce_premul: dst and src overlap without being the same buffer");
    }
    return scale(dtype, dst, src, count, factor, false, isa);
}

td_status td_reduce_premul(td_dtype dtype, void *dst, const void *src, size_t count, double factor)
{
    return reduce_premul_isa(dtype, dst, src, count, factor, TD_REDUCE_ISA_AUTO);
}

td_status reduce_finish_isa(td_reduce_op op, td_dtype dtype, void *buf, size_t count, int world_size,
                               td_reduce_isa isa)
{
    TD_TRY(check_isa(isa));
    TD_TRY(td_reduce_check(op, dtype));
    if (op != TD_AVG)
        return TD_OK;
    if (world_size <= 0)
        return error_fmt(TD_ERR_INVALID, "td_reduce_finish: world_size must be positive, got %d", world_size);
    if (count && !buf)
        return error_fmt(TD_ERR_INVALID, "td_reduce_finish: buf is NULL for %zu elements", count);
    return scale(dtype, buf, buf, count, (double)world_size, true, isa);
}

td_status td_reduce_finish(td_reduce_op op, td_dtype dtype, void *buf, size_t count, int world_size)
{
    return reduce_finish_isa(op, dtype, buf, count, world_size, TD_REDUCE_ISA_AUTO);
}
