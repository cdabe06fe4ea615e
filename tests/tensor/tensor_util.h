/* Helpers for the tensor tests: reference element conversions written independently of the
 * library (by arithmetic on doubles, not by bit tricks), element loads and stores through them,
 * random operands that include the special values, and tensor builders. */
#ifndef TDIST_TESTS_TENSOR_UTIL_H
#define TDIST_TESTS_TENSOR_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/tensor.h>
#include <tdist/testing.h>

/* ---- reference 16-bit float conversions ----------------------------------------------------- */

/* Rounds |x| (finite, >= 0) to a binary format with `mant` stored mantissa bits, minimum normal
 * exponent emin and maximum exponent emax: returns the rounded value (inf on overflow). nearbyint
 * rounds ties to even in the default rounding mode. */
static inline double ref_round(double x, int mant, int emin, int emax)
{
    if (x == 0)
        return 0;
    int e;
    frexp(x, &e);
    int exp = e - 1; /* x in [2^exp, 2^(exp+1)) */
    if (exp < emin)
        exp = emin; /* subnormal: a fixed quantum */
    double q = ldexp(1.0, exp - mant);
    double v = nearbyint(x / q) * q;
    double limit = ldexp(1.0, emax + 1); /* the first value past the largest finite */
    return v >= limit ? INFINITY : v;
}

static inline uint16_t ref_encode16(double x, int mant, int emin, int bias, uint16_t nan)
{
    if (isnan(x))
        return nan;
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    uint16_t exp_all = (uint16_t)(((1 << (15 - mant)) - 1) << mant);
    if (isinf(a))
        return sign | exp_all;
    if (a < ldexp(1.0, emin)) /* subnormal or zero */
        return sign | (uint16_t)(a / ldexp(1.0, emin - mant));
    int e;
    frexp(a, &e);
    int exp = e - 1;
    uint16_t m = (uint16_t)(a / ldexp(1.0, exp - mant) - ldexp(1.0, mant));
    return sign | (uint16_t)((exp + bias) << mant) | m;
}

static inline uint16_t ref_f2h(double x)
{
    return ref_encode16(isnan(x) ? x : copysign(ref_round(fabs(x), 10, -14, 15), x), 10, -14, 15, 0x7E00);
}

static inline uint16_t ref_f2bf(double x)
{
    return ref_encode16(isnan(x) ? x : copysign(ref_round(fabs(x), 7, -126, 127), x), 7, -126, 127, 0x7FC0);
}

static inline double ref_decode16(uint16_t h, int mant, int emin, int bias)
{
    int expbits = 15 - mant;
    int e = (h >> mant) & ((1 << expbits) - 1);
    int m = h & ((1 << mant) - 1);
    double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == (1 << expbits) - 1)
        return m ? NAN : s * INFINITY;
    if (e == 0)
        return s * m * ldexp(1.0, emin - mant);
    return s * (1.0 + m * ldexp(1.0, -mant)) * ldexp(1.0, e - bias);
}

static inline double ref_h2f(uint16_t h) { return ref_decode16(h, 10, -14, 15); }
static inline double ref_bf2f(uint16_t b) { return ref_decode16(b, 7, -126, 127); }

/* ---- element access ---------------------------------------------------------------------------- */

static inline int64_t load_int(td_dtype dt, const void *p)
{
    switch (dt) {
    case TD_BOOL: return *(const uint8_t *)p != 0;
    case TD_UINT8: return *(const uint8_t *)p;
    case TD_INT8: return *(const int8_t *)p;
    case TD_INT16: { int16_t v; memcpy(&v, p, 2); return v; }
    case TD_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
    default: { int64_t v; memcpy(&v, p, 8); return v; }
    }
}

static inline double load_real(td_dtype dt, const void *p)
{
    switch (dt) {
    case TD_FLOAT16: { uint16_t v; memcpy(&v, p, 2); return ref_h2f(v); }
    case TD_BFLOAT16: { uint16_t v; memcpy(&v, p, 2); return ref_bf2f(v); }
    case TD_FLOAT32: case TD_COMPLEX64: { float v; memcpy(&v, p, 4); return v; }
    case TD_FLOAT64: case TD_COMPLEX128: { double v; memcpy(&v, p, 8); return v; }
    default: return (double)load_int(dt, p);
    }
}

static inline void load_complex(td_dtype dt, const void *p, double *re, double *im)
{
    *re = load_real(dt, p);
    *im = 0;
    if (dt == TD_COMPLEX64)
        *im = load_real(dt, (const char *)p + 4);
    else if (dt == TD_COMPLEX128)
        *im = load_real(dt, (const char *)p + 8);
}

/* Stores a floating value rounded to nearest even by the reference conversions. */
static inline void store_real(td_dtype dt, void *p, double v)
{
    switch (dt) {
    case TD_FLOAT16: { uint16_t h = ref_f2h(v); memcpy(p, &h, 2); break; }
    case TD_BFLOAT16: { uint16_t h = ref_f2bf(v); memcpy(p, &h, 2); break; }
    case TD_FLOAT32: { float f = (float)v; memcpy(p, &f, 4); break; }
    case TD_FLOAT64: memcpy(p, &v, 8); break;
    default: TD_FAIL("store_real: %s is not a real floating dtype", td_dtype_name(dt));
    }
}

static inline void describe_element(td_dtype dt, const void *p, char *buf, size_t len)
{
    if (td_dtype_is_integral(dt, true)) {
        snprintf(buf, len, "%lld", (long long)load_int(dt, p));
    } else if (td_dtype_is_complex(dt)) {
        double re, im;
        load_complex(dt, p, &re, &im);
        snprintf(buf, len, "(%.9g%+.9gj)", re, im);
    } else if (td_dtype_size(dt) == 2) {
        uint16_t h;
        memcpy(&h, p, 2);
        snprintf(buf, len, "%.9g (0x%04x)", load_real(dt, p), h);
    } else {
        snprintf(buf, len, "%.17g", load_real(dt, p));
    }
}

/* ---- random operands --------------------------------------------------------------------------- */

static inline uint64_t rng_next(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline double random_real(uint64_t *s)
{
    static const double specials[] = {0.0, -0.0, NAN, INFINITY, -INFINITY, 1.0, -1.0, 65504.0, 6e-8, 1e38, -3e-39};
    uint64_t r = rng_next(s);
    if (r % 8 == 0)
        return specials[(r >> 8) % (sizeof specials / sizeof specials[0])];
    double mant = (double)(r >> 11) / 9007199254740992.0; /* [0, 1) */
    int e = (int)((r >> 3) % 41) - 20;
    return ((r & 4) ? -1 : 1) * ldexp(1.0 + mant, e);
}

/* n elements of dt: integers are random bits with the extremes mixed in, float16/bfloat16 random
 * bit patterns (every class: NaN, inf, subnormal), float32/64 a mix of moderate values, random
 * bits and special values. */
static inline void fill_random(td_dtype dt, void *buf, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    size_t es = td_dtype_size(dt);
    char *p = buf;
    for (size_t i = 0; i < n; i++, p += es) {
        uint64_t r = rng_next(&s);
        switch (dt) {
        case TD_BOOL: *p = (char)(r & 1); break;
        case TD_FLOAT16:
        case TD_BFLOAT16: memcpy(p, &r, 2); break;
        case TD_FLOAT32: {
            float f;
            if (r % 4 == 0)
                memcpy(&f, &r, 4); /* random bits */
            else
                f = (float)random_real(&s);
            memcpy(p, &f, 4);
            break;
        }
        case TD_FLOAT64: {
            double d;
            if (r % 4 == 0)
                memcpy(&d, &r, 8); /* random bits */
            else
                d = random_real(&s);
            memcpy(p, &d, 8);
            break;
        }
        case TD_COMPLEX64: {
            float c[2] = {(float)random_real(&s), (float)random_real(&s)};
            memcpy(p, c, 8);
            break;
        }
        case TD_COMPLEX128: {
            double c[2] = {random_real(&s), random_real(&s)};
            memcpy(p, c, 16);
            break;
        }
        default: {
            /* Integers: random bits; 1 in 4 an extreme (min, max, 0, -1) or a small value. */
            if (r % 4 == 0) {
                static const int64_t picks[] = {INT64_MIN, INT64_MAX, 0, -1, 1, 2, 127, 128, 255, 32767, -32768};
                int64_t v = picks[(r >> 8) % (sizeof picks / sizeof picks[0])];
                if (es < 8 && (v == INT64_MIN || v == INT64_MAX))
                    v = (v == INT64_MIN) ? -((int64_t)1 << (es * 8 - 1)) : ((int64_t)1 << (es * 8 - 1)) - 1;
                memcpy(p, &v, es);
            } else {
                memcpy(p, &r, es);
            }
            break;
        }
        }
    }
}

/* ---- tensors --------------------------------------------------------------------------------- */

/* A contiguous tensor of dtype dt and shape, with values[i] (converted) in row-major order. */
static inline td_tensor *tensor_of(td_dtype dt, td_shape shape, const double *values)
{
    td_tensor *t, *flat;
    TD_CHECK_OK(td_tensor_zeros(dt, shape, &t));
    TD_CHECK_OK(td_tensor_reshape(t, TD_SHAPE(-1), &flat));
    int64_t n = td_tensor_numel(t);
    for (int64_t i = 0; i < n; i++)
        TD_CHECK_OK(td_tensor_set_f64(flat, &i, values[i]));
    td_tensor_release(flat);
    return t;
}

/* The element at a flat row-major position, as double. */
static inline double value_at(const td_tensor *t, int64_t flat)
{
    int nd = td_tensor_ndim(t);
    int64_t idx[TD_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
        int64_t size = td_tensor_sizes(t)[d];
        idx[d] = flat % size;
        flat /= size;
    }
    double v;
    TD_CHECK_OK(td_tensor_get_f64(t, idx, &v));
    return v;
}

static inline void check_format(const td_tensor *t, const char *want)
{
    char *s = td_tensor_format(t);
    TD_CHECK_STR_EQ(s, want);
    free(s);
}

#endif
