/* Data movement between tensors: copy with dtype conversion and broadcasting, fill, read/write
 * to contiguous buffers, element get/set, and the comparisons (equal, allclose).
 *
 * Conversions follow PyTorch's copy_: floating to integer truncates toward zero, anything to bool
 * is `!= 0`, complex to real drops the imaginary part, double to float16/bfloat16 goes through
 * float32 (as c10::Half does). Out-of-range float to integer conversions, undefined in C, give what
 * torch gives on x86 (see f2i32 / f2i64), without UB. Each (source, destination) dtype pair has its own strided 1-D loop; a copy sorts and merges
 * the dims of both operands so that this loop runs over the longest contiguous runs, and a
 * same-dtype copy of contiguous runs is a memcpy. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "tensor/device_tensor.h"
#include "tensor/dtype.h"
#include "tensor/half.h"
#include "tensor/storage.h"
#include "tensor/strided.h"

/* ---- element loads and stores ------------------------------------------------------------------ */

/* Loads produce one of five value classes: int64_t (bool and integers), float (float16, bfloat16,
 * float32), double, td_c64, td_c128. memcpy keeps unaligned buffers (td_tensor_read/write) legal. */
#define LOAD_AS(type, p) \
    ({                   \
        type v_;         \
        memcpy(&v_, (p), sizeof v_); \
        v_;              \
    })
static inline int64_t load_b8(const char *p) { return LOAD_AS(uint8_t, p) != 0; }
static inline int64_t load_u8(const char *p) { return LOAD_AS(uint8_t, p); }
static inline int64_t load_i8(const char *p) { return LOAD_AS(int8_t, p); }
static inline int64_t load_i16(const char *p) { return LOAD_AS(int16_t, p); }
static inline int64_t load_i32(const char *p) { return LOAD_AS(int32_t, p); }
static inline int64_t load_i64(const char *p) { return LOAD_AS(int64_t, p); }
static inline float load_f16(const char *p) { return h2f(LOAD_AS(uint16_t, p)); }
static inline float load_bf16(const char *p) { return bf2f(LOAD_AS(uint16_t, p)); }
static inline float load_f32(const char *p) { return LOAD_AS(float, p); }
static inline double load_f64(const char *p) { return LOAD_AS(double, p); }
static inline td_c64 load_c64(const char *p) { return LOAD_AS(td_c64, p); }
static inline td_c128 load_c128(const char *p) { return LOAD_AS(td_c128, p); }

/* Float to integer with x86's answer for NaN and out-of-range values, which is what torch gives:
 * int64 converts with the 64-bit cvttsd2si (INT64_MIN when out of range), the narrower types with
 * the 32-bit one (INT32_MIN), then keep the low bits. */
static inline int64_t f2i64(double v)
{
    if (v >= -9223372036854775808.0 && v < 9223372036854775808.0)
        return (int64_t)v;
    return INT64_MIN;
}

static inline int64_t f2i32(double v)
{
    if (v > -2147483649.0 && v < 2147483648.0)
        return (int32_t)v;
    return INT32_MIN;
}

#define STORE_RAW(type, p, val)        \
    do {                               \
        type s_ = (val);               \
        memcpy((p), &s_, sizeof s_);   \
    } while (0)

/* One store per (destination dtype, value class), picked by _Generic on the loaded value. */
#define DEF_STORE_INT(name, type, f2i)                                                                 \
    static inline void store_##name##_i(char *p, int64_t v) { STORE_RAW(type, p, (type)(uint64_t)v); } \
    static inline void store_##name##_f(char *p, float v) { STORE_RAW(type, p, (type)(uint64_t)f2i(v)); } \
    static inline void store_##name##_d(char *p, double v) { STORE_RAW(type, p, (type)(uint64_t)f2i(v)); } \
    static inline void store_##name##_cf(char *p, td_c64 v) { store_##name##_f(p, v.re); }          \
    static inline void store_##name##_cd(char *p, td_c128 v) { store_##name##_d(p, v.re); }
DEF_STORE_INT(u8, uint8_t, f2i32)
DEF_STORE_INT(i8, int8_t, f2i32)
DEF_STORE_INT(i16, int16_t, f2i32)
DEF_STORE_INT(i32, int32_t, f2i32)
DEF_STORE_INT(i64, int64_t, f2i64)

static inline void store_b8_i(char *p, int64_t v) { STORE_RAW(uint8_t, p, v != 0); }
static inline void store_b8_f(char *p, float v) { STORE_RAW(uint8_t, p, v != 0); }
static inline void store_b8_d(char *p, double v) { STORE_RAW(uint8_t, p, v != 0); }
static inline void store_b8_cf(char *p, td_c64 v) { STORE_RAW(uint8_t, p, v.re != 0 || v.im != 0); }
static inline void store_b8_cd(char *p, td_c128 v) { STORE_RAW(uint8_t, p, v.re != 0 || v.im != 0); }

#define DEF_STORE_HALF(name, conv)                                                                      \
    static inline void store_##name##_i(char *p, int64_t v) { STORE_RAW(uint16_t, p, conv((float)v)); } \
    static inline void store_##name##_f(char *p, float v) { STORE_RAW(uint16_t, p, conv(v)); }          \
    static inline void store_##name##_d(char *p, double v) { STORE_RAW(uint16_t, p, conv((float)v)); }  \
    static inline void store_##name##_cf(char *p, td_c64 v) { STORE_RAW(uint16_t, p, conv(v.re)); }     \
    static inline void store_##name##_cd(char *p, td_c128 v) { STORE_RAW(uint16_t, p, conv((float)v.re)); }
DEF_STORE_HALF(f16, f2h)
DEF_STORE_HALF(bf16, f2bf)

#define DEF_STORE_REAL(name, type)                                                             \
    static inline void store_##name##_i(char *p, int64_t v) { STORE_RAW(type, p, (type)v); }   \
    static inline void store_##name##_f(char *p, float v) { STORE_RAW(type, p, (type)v); }     \
    static inline void store_##name##_d(char *p, double v) { STORE_RAW(type, p, (type)v); }    \
    static inline void store_##name##_cf(char *p, td_c64 v) { STORE_RAW(type, p, (type)v.re); } \
    static inline void store_##name##_cd(char *p, td_c128 v) { STORE_RAW(type, p, (type)v.re); }
DEF_STORE_REAL(f32, float)
DEF_STORE_REAL(f64, double)

#define DEF_STORE_COMPLEX(name, ctype, rtype)                                                                   \
    static inline void store_##name##_i(char *p, int64_t v) { STORE_RAW(ctype, p, ((ctype){(rtype)v, 0})); }   \
    static inline void store_##name##_f(char *p, float v) { STORE_RAW(ctype, p, ((ctype){(rtype)v, 0})); }     \
    static inline void store_##name##_d(char *p, double v) { STORE_RAW(ctype, p, ((ctype){(rtype)v, 0})); }    \
    static inline void store_##name##_cf(char *p, td_c64 v)                                                     \
    {                                                                                                           \
        STORE_RAW(ctype, p, ((ctype){(rtype)v.re, (rtype)v.im}));                                              \
    }                                                                                                           \
    static inline void store_##name##_cd(char *p, td_c128 v)                                                    \
    {                                                                                                           \
        STORE_RAW(ctype, p, ((ctype){(rtype)v.re, (rtype)v.im}));                                              \
    }
DEF_STORE_COMPLEX(c64, td_c64, float)
DEF_STORE_COMPLEX(c128, td_c128, double)

#define STORE(name, p, v)                                                                              \
    _Generic((v), int64_t: store_##name##_i, float: store_##name##_f, double: store_##name##_d,        \
             td_c64: store_##name##_cf, td_c128: store_##name##_cd)((p), (v))

/* ---- conversion loops -------------------------------------------------------------------------- */

typedef void (*conv_fn)(char *dst, ptrdiff_t ds, const char *src, ptrdiff_t ss, int64_t n);

/* The dtype list, twice: a macro cannot expand itself, and the table is a list of lists. In
 * td_dtype order. */
#define DTYPES_A(X, arg) \
    X(arg, b8) X(arg, u8) X(arg, i8) X(arg, i16) X(arg, i32) X(arg, i64) \
    X(arg, f16) X(arg, bf16) X(arg, f32) X(arg, f64) X(arg, c64) X(arg, c128)
#define DTYPES_B(X, arg) \
    X(arg, b8) X(arg, u8) X(arg, i8) X(arg, i16) X(arg, i32) X(arg, i64) \
    X(arg, f16) X(arg, bf16) X(arg, f32) X(arg, f64) X(arg, c64) X(arg, c128)

/* Element sizes by short name, for the contiguous loops' constant strides. */
enum { ES_b8 = 1, ES_u8 = 1, ES_i8 = 1, ES_i16 = 2, ES_i32 = 4, ES_i64 = 8, ES_f16 = 2, ES_bf16 = 2, ES_f32 = 4,
       ES_f64 = 8, ES_c64 = 8, ES_c128 = 16 };

/* The contiguous case gets its own loop with constant strides, which gcc can vectorize. */
#define DEF_CONV(S, D)                                                                          \
    static void conv_##S##_##D(char *dst, ptrdiff_t ds, const char *src, ptrdiff_t ss, int64_t n) \
    {                                                                                           \
        if (ds == ES_##D && ss == ES_##S) {                                                     \
            for (int64_t i = 0; i < n; i++)                                                     \
                STORE(D, dst + i * ES_##D, load_##S(src + i * ES_##S));                         \
            return;                                                                             \
        }                                                                                       \
        for (int64_t i = 0; i < n; i++)                                                         \
            STORE(D, dst + i * ds, load_##S(src + i * ss));                                     \
    }
#define DEF_CONV_ROW(unused, S) DTYPES_B(DEF_CONV, S)
DTYPES_A(DEF_CONV_ROW, unused)

#define CONV_ENTRY(S, D) conv_##S##_##D,
#define CONV_ROW(unused, S) {DTYPES_B(CONV_ENTRY, S)},
static const conv_fn conv_table[TD_DTYPE_COUNT][TD_DTYPE_COUNT] = {DTYPES_A(CONV_ROW, unused)};

void tensor_convert_element(void *dst, td_dtype dst_dtype, const void *src, td_dtype src_dtype)
{
    conv_table[src_dtype][dst_dtype](dst, 0, src, 0, 1);
}

/* Same-dtype strided copies by element size. */
#define DEF_MOVE(bytes)                                                                          \
    static void move_##bytes(char *dst, ptrdiff_t ds, const char *src, ptrdiff_t ss, int64_t n) \
    {                                                                                            \
        for (int64_t i = 0; i < n; i++)                                                          \
            memcpy(dst + i * ds, src + i * ss, bytes);                                           \
    }
DEF_MOVE(1)
DEF_MOVE(2)
DEF_MOVE(4)
DEF_MOVE(8)
DEF_MOVE(16)

static conv_fn move_fn(size_t elsize)
{
    switch (elsize) {
    case 1: return move_1;
    case 2: return move_2;
    case 4: return move_4;
    case 8: return move_8;
    default: return move_16;
    }
}

/* ---- iterating two operands ------------------------------------------------------------------- */

/* Two operands of one shape, in bytes, after dropping size-1 dims, ordering dims by the first
 * operand's strides (outermost first) and merging dims that are contiguous in both. */
typedef struct loop2 {
    int ndim;
    int64_t sizes[TD_MAX_DIMS];
    int64_t st[2][TD_MAX_DIMS]; /* bytes */
} loop2;

static void loop2_prepare(loop2 *l, int ndim, const int64_t *sizes, const int64_t *s0, size_t e0, const int64_t *s1,
                          size_t e1)
{
    int n = 0;
    for (int i = 0; i < ndim; i++) {
        if (sizes[i] == 1)
            continue;
        l->sizes[n] = sizes[i];
        l->st[0][n] = s0[i] * (int64_t)e0;
        l->st[1][n] = s1[i] * (int64_t)e1;
        n++;
    }
    /* Insertion sort by |stride of operand 0| descending (then operand 1), so the innermost loop
     * walks operand 0 (the destination) with its smallest stride. */
    for (int i = 1; i < n; i++) {
        for (int j = i; j > 0; j--) {
            int64_t a0 = llabs(l->st[0][j - 1]), b0 = llabs(l->st[0][j]);
            int64_t a1 = llabs(l->st[1][j - 1]), b1 = llabs(l->st[1][j]);
            if (a0 > b0 || (a0 == b0 && a1 >= b1))
                break;
            int64_t t = l->sizes[j];
            l->sizes[j] = l->sizes[j - 1];
            l->sizes[j - 1] = t;
            for (int k = 0; k < 2; k++) {
                t = l->st[k][j];
                l->st[k][j] = l->st[k][j - 1];
                l->st[k][j - 1] = t;
            }
        }
    }
    /* Merge dim i into dim i+1 (inner) when stepping dim i equals running through dim i+1. */
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m > 0 && l->st[0][m - 1] == l->st[0][i] * l->sizes[i] && l->st[1][m - 1] == l->st[1][i] * l->sizes[i]) {
            l->sizes[m - 1] *= l->sizes[i];
            l->st[0][m - 1] = l->st[0][i];
            l->st[1][m - 1] = l->st[1][i];
            continue;
        }
        l->sizes[m] = l->sizes[i];
        l->st[0][m] = l->st[0][i];
        l->st[1][m] = l->st[1][i];
        m++;
    }
    l->ndim = m;
}

/* Calls fn on every innermost run; fn returns false to stop. Returns false when stopped. */
typedef bool (*run_fn)(void *ctx, char *p0, ptrdiff_t s0, char *p1, ptrdiff_t s1, int64_t n);

static bool loop2_run(const loop2 *l, char *p0, char *p1, run_fn fn, void *ctx)
{
    if (l->ndim == 0)
        return fn(ctx, p0, 0, p1, 0, 1);
    int inner = l->ndim - 1;
    int64_t idx[TD_MAX_DIMS] = {0};
    for (;;) {
        if (!fn(ctx, p0, l->st[0][inner], p1, l->st[1][inner], l->sizes[inner]))
            return false;
        int d = inner - 1;
        for (; d >= 0; d--) {
            p0 += l->st[0][d];
            p1 += l->st[1][d];
            if (++idx[d] < l->sizes[d])
                break;
            p0 -= l->st[0][d] * l->sizes[d];
            p1 -= l->st[1][d] * l->sizes[d];
            idx[d] = 0;
        }
        if (d < 0)
            return true;
    }
}

/* Copies where the source is contiguous along a different dim than the destination (a transpose)
 * walk one of the two with a large stride whichever dim is inner. Visiting the plane of those two
 * dims in square tiles keeps the lines of both in cache. */
enum { TILE = 32 };

static void loop2_run_tiled(const loop2 *l0, int src_inner, char *p0, char *p1, run_fn fn, void *ctx)
{
    loop2 l = *l0;
    int inner = l.ndim - 1, rows = inner - 1;
    /* Bring the source's inner dim next to the destination's (any order of outer dims visits the
     * same elements). */
    int64_t t = l.sizes[rows];
    l.sizes[rows] = l.sizes[src_inner];
    l.sizes[src_inner] = t;
    for (int k = 0; k < 2; k++) {
        t = l.st[k][rows];
        l.st[k][rows] = l.st[k][src_inner];
        l.st[k][src_inner] = t;
    }
    int64_t idx[TD_MAX_DIMS] = {0};
    for (;;) {
        for (int64_t rb = 0; rb < l.sizes[rows]; rb += TILE) {
            int64_t rend = rb + TILE < l.sizes[rows] ? rb + TILE : l.sizes[rows];
            for (int64_t cb = 0; cb < l.sizes[inner]; cb += TILE) {
                int64_t len = cb + TILE < l.sizes[inner] ? TILE : l.sizes[inner] - cb;
                for (int64_t r = rb; r < rend; r++)
                    fn(ctx, p0 + r * l.st[0][rows] + cb * l.st[0][inner], l.st[0][inner],
                       p1 + r * l.st[1][rows] + cb * l.st[1][inner], l.st[1][inner], len);
            }
        }
        int d = rows - 1;
        for (; d >= 0; d--) {
            p0 += l.st[0][d];
            p1 += l.st[1][d];
            if (++idx[d] < l.sizes[d])
                break;
            p0 -= l.st[0][d] * l.sizes[d];
            p1 -= l.st[1][d] * l.sizes[d];
            idx[d] = 0;
        }
        if (d < 0)
            return;
    }
}

/* The dim along which operand 1 (the source) has its smallest non-zero stride when that is not
 * the innermost dim and the innermost one is long in the source's memory; -1 otherwise. */
static int transposed_dim(const loop2 *l, size_t src_elsize)
{
    if (l->ndim < 2)
        return -1;
    int inner = l->ndim - 1, best = inner;
    for (int d = 0; d < l->ndim; d++) {
        int64_t s = llabs(l->st[1][d]);
        if (s != 0 && (llabs(l->st[1][best]) == 0 || s < llabs(l->st[1][best])))
            best = d;
    }
    if (best == inner || llabs(l->st[1][inner]) < (int64_t)(TILE * src_elsize) || l->sizes[best] < 2)
        return -1;
    return best;
}

/* ---- copy ------------------------------------------------------------------------------------- */

typedef struct copy_ctx {
    conv_fn fn;
    size_t elsize;
    bool same;
} copy_ctx;

static bool copy_run(void *vctx, char *d, ptrdiff_t ds, char *s, ptrdiff_t ss, int64_t n)
{
    copy_ctx *c = vctx;
    if (c->same && ds == (ptrdiff_t)c->elsize && ss == (ptrdiff_t)c->elsize)
        memcpy(d, s, (size_t)n * c->elsize);
    else
        c->fn(d, ds, s, ss, n);
    return true;
}

static int64_t numel_strided(const td_strided *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->sizes[i];
    return n;
}

/* The byte range [lo, hi) an operand touches (numel > 0). */
static void byte_range(const td_strided *t, char **lo, char **hi)
{
    int64_t mn = 0, mx = 0;
    for (int i = 0; i < t->ndim; i++) {
        int64_t span = (t->sizes[i] - 1) * t->strides[i];
        if (span < 0)
            mn += span;
        else
            mx += span;
    }
    int64_t es = (int64_t)td_dtype_size(t->dtype);
    *lo = t->data + mn * es;
    *hi = t->data + (mx + 1) * es;
}

static td_status check_no_internal_overlap(const td_strided *t)
{
    for (int i = 0; i < t->ndim; i++) {
        if (t->strides[i] == 0 && t->sizes[i] > 1)
            return error_fmt(TD_ERR_INVALID,
                            "unsupported operation: more than one element of the written-to tensor refers to a single "
                            "memory location. Please clone() the tensor before performing the operation.");
    }
    return TD_OK;
}

/* src's strides broadcast to dst's shape, with TensorIterator's messages when they do not fit. */
static td_status broadcast_src(const td_strided *dst, const td_strided *src, int64_t *strides)
{
    char b1[TD_MAX_DIMS * 22 + 4], b2[TD_MAX_DIMS * 22 + 4];
    int nd;
    int64_t bshape[TD_MAX_DIMS];
    TD_TRY(strided_broadcast_shape(dst->ndim, dst->sizes, src->ndim, src->sizes, &nd, bshape));
    bool mismatch = nd > dst->ndim; /* else nd == dst->ndim */
    for (int i = 0; i < dst->ndim && !mismatch; i++)
        mismatch = bshape[i] != dst->sizes[i];
    if (mismatch)
        return error_fmt(TD_ERR_INVALID, "output with shape %s doesn't match the broadcast shape %s",
                        tensor_format_sizes(b1, sizeof b1, dst->ndim, dst->sizes), tensor_format_sizes(b2, sizeof b2, nd, bshape));
    for (int i = 0; i < dst->ndim; i++) {
        int si = i - (dst->ndim - src->ndim);
        strides[i] = si >= 0 && src->sizes[si] == dst->sizes[i] ? src->strides[si] : 0;
    }
    return TD_OK;
}

/* fill writes one value, so a destination whose elements share memory is fine there (as in
 * torch's fill_); a copy of varying values into one is refused. */
static td_status copy_impl(const td_strided *dst, const td_strided *src, bool allow_dst_overlap)
{
    int64_t sstrides[TD_MAX_DIMS];
    TD_TRY(broadcast_src(dst, src, sstrides));
    int64_t n = numel_strided(dst);
    if (n == 0)
        return TD_OK;
    if (!allow_dst_overlap)
        TD_TRY(check_no_internal_overlap(dst));

    /* A source that overlaps the destination is staged through a contiguous copy, so the result
     * does not depend on the loop order. */
    char *dlo, *dhi, *slo, *shi;
    byte_range(dst, &dlo, &dhi);
    byte_range(src, &slo, &shi);
    if (dlo < shi && slo < dhi) {
        bool identical = dst->data == src->data && dst->dtype == src->dtype && dst->ndim == src->ndim;
        for (int i = 0; identical && i < dst->ndim; i++)
            identical = dst->sizes[i] == src->sizes[i] && dst->strides[i] == src->strides[i];
        if (identical)
            return TD_OK;
        int64_t sn = numel_strided(src);
        size_t bytes = (size_t)sn * td_dtype_size(src->dtype);
        void *tmp;
        TD_TRY(alloc_try(bytes, "a staging copy of an overlapping source tensor", &tmp));
        td_strided staged = strided_contiguous(tmp, src->dtype, src->ndim, src->sizes);
        td_status st = strided_copy(&staged, src);
        if (st == TD_OK)
            st = strided_copy(dst, &staged);
        free(tmp);
        return st;
    }

    loop2 l;
    size_t de = td_dtype_size(dst->dtype), se = td_dtype_size(src->dtype);
    loop2_prepare(&l, dst->ndim, dst->sizes, dst->strides, de, sstrides, se);
    copy_ctx c = {
        .fn = dst->dtype == src->dtype ? move_fn(de) : conv_table[src->dtype][dst->dtype],
        .elsize = de,
        .same = dst->dtype == src->dtype,
    };
    int src_inner = transposed_dim(&l, se);
    if (src_inner >= 0)
        loop2_run_tiled(&l, src_inner, dst->data, src->data, copy_run, &c);
    else
        loop2_run(&l, dst->data, src->data, copy_run, &c);
    return TD_OK;
}

td_status strided_copy(const td_strided *dst, const td_strided *src) { return copy_impl(dst, src, false); }

td_status td_tensor_copy(td_tensor *dst, const td_tensor *src)
{
    if (!dst || !src)
        return error_fmt(TD_ERR_INVALID, "td_tensor_copy: %s is NULL", dst ? "src" : "dst");
    if (!tensor_is_host(dst) || !tensor_is_host(src))
        return td_tensor_copy_ex(dst, src, false);
    td_strided d = strided_of(dst), s = strided_of(src);
    TD_TRY(strided_copy(&d, &s));
    storage_bump_version(dst->storage);
    return TD_OK;
}

static td_status fill_with(td_tensor *t, const void *value, td_dtype vtype)
{
    if (!t)
        return error_fmt(TD_ERR_INVALID, "fill: tensor is NULL");
    if (!tensor_is_host(t))
        return tensor_device_fill(t, value, vtype);
    td_strided d = strided_of(t);
    td_strided s = {.data = (char *)value, .dtype = vtype, .ndim = 0};
    TD_TRY(copy_impl(&d, &s, true));
    storage_bump_version(t->storage);
    return TD_OK;
}

td_status td_tensor_fill(td_tensor *t, double value) { return fill_with(t, &value, TD_FLOAT64); }

td_status td_tensor_fill_complex(td_tensor *t, double re, double im)
{
    td_c128 v = {re, im};
    return fill_with(t, &v, TD_COMPLEX128);
}

static td_status check_buffer(const td_tensor *t, const void *buf, size_t nbytes, const char *fn)
{
    if (!t)
        return error_fmt(TD_ERR_INVALID, "%s: tensor is NULL", fn);
    size_t want = (size_t)strided_numel(t->ndim, t->sizes) * td_dtype_size(t->dtype);
    if (nbytes != want)
        return error_fmt(TD_ERR_INVALID, "%s: the buffer has %zu bytes but the tensor holds %zu (%lld elements of %s)",
                        fn, nbytes, want, (long long)strided_numel(t->ndim, t->sizes), td_dtype_name(t->dtype));
    if (!buf && want)
        return error_fmt(TD_ERR_INVALID, "%s: buffer is NULL", fn);
    return TD_OK;
}

td_status td_tensor_read(const td_tensor *t, void *dst, size_t nbytes)
{
    TD_TRY(check_buffer(t, dst, nbytes, "td_tensor_read"));
    TD_TRY(tensor_require_host(t, "td_tensor_read"));
    if (!nbytes)
        return TD_OK;
    td_strided s = strided_of(t);
    td_strided d = strided_contiguous(dst, t->dtype, t->ndim, t->sizes);
    return strided_copy(&d, &s);
}

td_status td_tensor_write(td_tensor *t, const void *src, size_t nbytes)
{
    TD_TRY(check_buffer(t, src, nbytes, "td_tensor_write"));
    TD_TRY(tensor_require_host(t, "td_tensor_write"));
    if (!nbytes)
        return TD_OK;
    td_strided d = strided_of(t);
    td_strided s = strided_contiguous((void *)src, t->dtype, t->ndim, t->sizes);
    TD_TRY(strided_copy(&d, &s));
    storage_bump_version(t->storage);
    return TD_OK;
}

/* ---- element access --------------------------------------------------------------------------- */

static td_status element_ptr(const td_tensor *t, const int64_t *index, char **out, const char *fn)
{
    if (!t)
        return error_fmt(TD_ERR_INVALID, "element access: tensor is NULL");
    TD_TRY(tensor_require_host(t, fn));
    if (t->ndim > 0 && !index)
        return error_fmt(TD_ERR_INVALID, "element access: index is NULL for a %d-dim tensor", t->ndim);
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) {
        int64_t ix = index[i], size = t->sizes[i];
        if (ix < -size || ix >= size)
            return error_fmt(TD_ERR_INVALID, "index %lld is out of bounds for dimension %d with size %lld",
                            (long long)ix, i, (long long)size);
        off += (ix < 0 ? ix + size : ix) * t->strides[i];
    }
    *out = (char *)tensor_data_of(t) + off * (int64_t)td_dtype_size(t->dtype);
    return TD_OK;
}

td_status td_tensor_get_f64(const td_tensor *t, const int64_t *index, double *out)
{
    char *p;
    TD_TRY(element_ptr(t, index, &p, "td_tensor_get_f64"));
    tensor_convert_element(out, TD_FLOAT64, p, t->dtype);
    return TD_OK;
}

td_status td_tensor_get_i64(const td_tensor *t, const int64_t *index, int64_t *out)
{
    char *p;
    TD_TRY(element_ptr(t, index, &p, "td_tensor_get_i64"));
    tensor_convert_element(out, TD_INT64, p, t->dtype);
    return TD_OK;
}

td_status td_tensor_get_complex(const td_tensor *t, const int64_t *index, double *re, double *im)
{
    char *p;
    TD_TRY(element_ptr(t, index, &p, "td_tensor_get_complex"));
    td_c128 v;
    tensor_convert_element(&v, TD_COMPLEX128, p, t->dtype);
    if (re)
        *re = v.re;
    if (im)
        *im = v.im;
    return TD_OK;
}

td_status td_tensor_set_f64(td_tensor *t, const int64_t *index, double value)
{
    char *p;
    TD_TRY(element_ptr(t, index, &p, "td_tensor_set_f64"));
    storage_bump_version(t->storage);
    tensor_convert_element(p, t->dtype, &value, TD_FLOAT64);
    return TD_OK;
}

td_status td_tensor_set_i64(td_tensor *t, const int64_t *index, int64_t value)
{
    char *p;
    TD_TRY(element_ptr(t, index, &p, "td_tensor_set_i64"));
    storage_bump_version(t->storage);
    tensor_convert_element(p, t->dtype, &value, TD_INT64);
    return TD_OK;
}

td_status td_tensor_set_complex(td_tensor *t, const int64_t *index, double re, double im)
{
    char *p;
    TD_TRY(element_ptr(t, index, &p, "td_tensor_set_complex"));
    storage_bump_version(t->storage);
    td_c128 v = {re, im};
    tensor_convert_element(p, t->dtype, &v, TD_COMPLEX128);
    return TD_OK;
}

/* ---- comparison ------------------------------------------------------------------------------- */

typedef struct cmp_ctx {
    td_dtype da, db;
    double rtol, atol;
    bool equal_nan;
} cmp_ctx;

/* Elements compare as values of their class: integers exactly, floating point as doubles (every
 * float16/bfloat16/float32 value is exact in double; 0 == -0, NaN != NaN), complex by parts. */
static bool equal_run(void *vctx, char *a, ptrdiff_t sa, char *b, ptrdiff_t sb, int64_t n)
{
    cmp_ctx *c = vctx;
    td_dtype dt = c->da;
    for (int64_t i = 0; i < n; i++, a += sa, b += sb) {
        if (td_dtype_is_integral(dt, true)) {
            int64_t x, y;
            tensor_convert_element(&x, TD_INT64, a, dt);
            tensor_convert_element(&y, TD_INT64, b, dt);
            if (x != y)
                return false;
        } else {
            td_c128 x, y;
            tensor_convert_element(&x, TD_COMPLEX128, a, dt);
            tensor_convert_element(&y, TD_COMPLEX128, b, dt);
            if (!(x.re == y.re && x.im == y.im))
                return false;
        }
    }
    return true;
}

/* torch.equal and allclose of device tensors compare on the host: both come over (blocking) first.
 * A failed copy compares unequal, with its message set. */
static bool on_host(const td_tensor *a, const td_tensor *b, td_tensor **ha, td_tensor **hb)
{
    const td_device cpu = {TD_DEVICE_CPU, -1};
    *ha = *hb = NULL;
    if (td_tensor_to_device((td_tensor *)a, cpu, false, ha) != TD_OK ||
        td_tensor_to_device((td_tensor *)b, cpu, false, hb) != TD_OK) {
        td_tensor_release(*ha);
        return false;
    }
    return true;
}

bool td_tensor_equal(const td_tensor *a, const td_tensor *b)
{
    if (!a || !b || a->dtype != b->dtype || !strided_same_sizes(a, b))
        return false;
    if (!tensor_is_host(a) || !tensor_is_host(b)) {
        td_tensor *ha, *hb;
        if (!on_host(a, b, &ha, &hb))
            return false;
        bool eq = td_tensor_equal(ha, hb);
        td_tensor_release(ha);
        td_tensor_release(hb);
        return eq;
    }
    td_strided sa = strided_of(a), sb = strided_of(b);
    if (numel_strided(&sa) == 0)
        return true;
    loop2 l;
    size_t es = td_dtype_size(a->dtype);
    loop2_prepare(&l, a->ndim, a->sizes, a->strides, es, b->strides, es);
    cmp_ctx c = {.da = a->dtype, .db = b->dtype};
    return loop2_run(&l, sa.data, sb.data, equal_run, &c);
}

/* torch.isclose: equal values (infinities included) are close; otherwise finite and within
 * atol + rtol * |b|; NaNs are close to each other only with equal_nan. */
static bool close_value(const cmp_ctx *c, td_c128 x, td_c128 y)
{
    bool xnan = isnan(x.re) || isnan(x.im), ynan = isnan(y.re) || isnan(y.im);
    if (xnan || ynan)
        return c->equal_nan && xnan && ynan;
    if (x.re == y.re && x.im == y.im)
        return true;
    double diff = hypot(x.re - y.re, x.im - y.im);
    double tol = c->atol + c->rtol * hypot(y.re, y.im);
    return isfinite(diff) && diff <= tol;
}

static bool close_run(void *vctx, char *a, ptrdiff_t sa, char *b, ptrdiff_t sb, int64_t n)
{
    cmp_ctx *c = vctx;
    for (int64_t i = 0; i < n; i++, a += sa, b += sb) {
        td_c128 x, y;
        tensor_convert_element(&x, TD_COMPLEX128, a, c->da);
        tensor_convert_element(&y, TD_COMPLEX128, b, c->db);
        if (!close_value(c, x, y))
            return false;
    }
    return true;
}

bool td_tensor_allclose(const td_tensor *a, const td_tensor *b, double rtol, double atol, bool equal_nan)
{
    if (!a || !b || !strided_same_sizes(a, b))
        return false;
    if (!tensor_is_host(a) || !tensor_is_host(b)) {
        td_tensor *ha, *hb;
        if (!on_host(a, b, &ha, &hb))
            return false;
        bool close = td_tensor_allclose(ha, hb, rtol, atol, equal_nan);
        td_tensor_release(ha);
        td_tensor_release(hb);
        return close;
    }
    td_strided sa = strided_of(a), sb = strided_of(b);
    if (numel_strided(&sa) == 0)
        return true;
    loop2 l;
    loop2_prepare(&l, a->ndim, a->sizes, a->strides, td_dtype_size(a->dtype), b->strides, td_dtype_size(b->dtype));
    cmp_ctx c = {.da = a->dtype, .db = b->dtype, .rtol = rtol, .atol = atol, .equal_nan = equal_nan};
    return loop2_run(&l, sa.data, sb.data, close_run, &c);
}
