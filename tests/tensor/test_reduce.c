/* Reduce kernels against a scalar reference written independently of src/tensor/reduce.c: every
 * (op, dtype) pair, in both builds (baseline and AVX2/F16C, where the CPU has it), for counts that
 * hit the vector loops' tails, every aliasing case and misaligned starts; invalid pairs and their
 * messages; float16/bfloat16 rounding, overflow and NaN; NaN propagation in MIN/MAX; integer
 * wraparound; PREMUL_SUM's premultiply and AVG's divide. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/testing.h>

#include "tensor/reduce.h"
#include "tensor_util.h"

/* ---- reference ------------------------------------------------------------------------------- */

/* Combines one element pair of dtype dt, writing the reference result to out. Integer arithmetic
 * is done on uint64 and truncated; floating point exactly in double (every sum and product of two
 * float16/bfloat16 values is exact there, and one rounding of a double result to float is
 * innocuous), then rounded with the reference conversions of tensor_util.h. */
static void ref_combine(td_reduce_op op, td_dtype dt, const void *pa, const void *pb, void *out)
{
    if (op == TD_AVG || op == TD_PREMUL_SUM)
        op = TD_SUM;
    size_t es = td_dtype_size(dt);
    if (dt == TD_BOOL) {
        bool a = *(const uint8_t *)pa != 0, b = *(const uint8_t *)pb != 0, r;
        switch (op) {
        case TD_SUM: case TD_MAX: case TD_BOR: r = a || b; break;
        case TD_PRODUCT: case TD_MIN: case TD_BAND: r = a && b; break;
        default: r = a != b; break;
        }
        *(uint8_t *)out = r;
        return;
    }
    if (td_dtype_is_integral(dt, false)) {
        int64_t a = load_int(dt, pa), b = load_int(dt, pb);
        uint64_t ua = (uint64_t)a, ub = (uint64_t)b, r;
        switch (op) {
        case TD_SUM: r = ua + ub; break;
        case TD_PRODUCT: r = ua * ub; break;
        case TD_MIN: r = (uint64_t)(a < b ? a : b); break;
        case TD_MAX: r = (uint64_t)(a > b ? a : b); break;
        case TD_BAND: r = ua & ub; break;
        case TD_BOR: r = ua | ub; break;
        default: r = ua ^ ub; break;
        }
        memcpy(out, &r, es); /* little-endian: the low bytes are the truncated value */
        return;
    }
    if (td_dtype_is_complex(dt)) {
        double ar, ai, br, bi;
        load_complex(dt, pa, &ar, &ai);
        load_complex(dt, pb, &br, &bi);
        if (dt == TD_COMPLEX64) {
            float re, im;
            if (op == TD_SUM) {
                re = (float)ar + (float)br;
                im = (float)ai + (float)bi;
            } else {
                re = (float)ar * (float)br - (float)ai * (float)bi;
                im = (float)ar * (float)bi + (float)ai * (float)br;
            }
            memcpy(out, &re, 4);
            memcpy((char *)out + 4, &im, 4);
        } else {
            double re = op == TD_SUM ? ar + br : ar * br - ai * bi;
            double im = op == TD_SUM ? ai + bi : ar * bi + ai * br;
            memcpy(out, &re, 8);
            memcpy((char *)out + 8, &im, 8);
        }
        return;
    }
    double a = load_real(dt, pa), b = load_real(dt, pb), r;
    switch (op) {
    case TD_SUM: r = a + b; break;
    case TD_PRODUCT: r = a * b; break;
    case TD_MIN: r = isnan(a) || isnan(b) ? NAN : (a < b ? a : b); break;
    default: r = isnan(a) || isnan(b) ? NAN : (a > b ? a : b); break;
    }
    store_real(dt, out, r);
}

/* Equal as the kernel must produce: bitwise, except that any NaN matches any NaN and that MIN/MAX
 * may return either zero when comparing 0 with -0. */
static bool same_element(td_dtype dt, const void *got, const void *want)
{
    if (memcmp(got, want, td_dtype_size(dt)) == 0)
        return true;
    if (td_dtype_is_floating(dt)) {
        double g = load_real(dt, got), w = load_real(dt, want);
        return (isnan(g) && isnan(w)) || (g == 0 && w == 0);
    }
    if (td_dtype_is_complex(dt)) {
        double gr, gi, wr, wi;
        load_complex(dt, got, &gr, &gi);
        load_complex(dt, want, &wr, &wi);
        return ((isnan(gr) && isnan(wr)) || gr == wr) && ((isnan(gi) && isnan(wi)) || gi == wi);
    }
    return false;
}

/* ---- every pair, every case -------------------------------------------------------------------- */

enum { MAXN = 1100, PAD = 4 };

typedef enum alias { OUT_OF_PLACE, DST_IS_A, DST_IS_B, ALL_SAME } alias;

static void check_kernel(td_reduce_op op, td_dtype dt, td_reduce_isa isa, size_t n, size_t offset, alias mode,
                         uint64_t seed)
{
    size_t es = td_dtype_size(dt), bytes = (MAXN + PAD) * es;
    /* Fresh heap blocks per run so ASan sees any access outside [offset, offset + n). */
    char *a = malloc(bytes), *b = malloc(bytes), *d = malloc(bytes), *want = malloc(bytes);
    TD_CHECK(a && b && d && want);
    fill_random(dt, a, MAXN + PAD, seed);
    fill_random(dt, b, MAXN + PAD, seed * 7 + 1);
    memset(d, 0xA5, bytes);
    char *pa = a + offset * es, *pb = b + offset * es, *pd = d + offset * es;
    if (mode == ALL_SAME)
        memcpy(b, a, bytes);
    for (size_t i = 0; i < n; i++)
        ref_combine(op, dt, pa + i * es, pb + i * es, want + i * es);

    td_reduce_fn fn = reduce_kernel_isa(op, dt, isa);
    TD_CHECK_MSG(fn, "no kernel for %s %s: %s", td_reduce_op_name(op), td_dtype_name(dt), td_last_error());
    char *dst = pd, *x = pa, *y = pb;
    switch (mode) {
    case OUT_OF_PLACE: break;
    case DST_IS_A: dst = x; break;
    case DST_IS_B: dst = y; break;
    case ALL_SAME: dst = y = x; break;
    }
    fn(dst, x, y, n);
    for (size_t i = 0; i < n; i++) {
        if (!same_element(dt, dst + i * es, want + i * es)) {
            char g[64], w[64], ea[64], eb[64];
            describe_element(dt, dst + i * es, g, sizeof g);
            describe_element(dt, want + i * es, w, sizeof w);
            describe_element(dt, a + (offset + i) * es, ea, sizeof ea);
            describe_element(dt, b + (offset + i) * es, eb, sizeof eb);
            TD_FAIL("%s %s (%s, n=%zu, offset=%zu, alias mode %d): element %zu of %s op %s is %s, want %s",
                    td_reduce_op_name(op), td_dtype_name(dt), reduce_isa_name(isa), n, offset, (int)mode, i, ea,
                    eb, g, w);
        }
    }
    /* Nothing written outside the n elements. */
    if (mode == OUT_OF_PLACE) {
        for (size_t i = 0; i < bytes; i++) {
            if ((i < offset * es || i >= (offset + n) * es) && (unsigned char)d[i] != 0xA5)
                TD_FAIL("%s %s wrote byte %zu outside its %zu elements", td_reduce_op_name(op), td_dtype_name(dt), i, n);
        }
    }
    free(a);
    free(b);
    free(d);
    free(want);
}

static void check_all_pairs(td_reduce_isa isa)
{
    if (!reduce_isa_available(isa))
        TD_SKIP(TD_SKIP_GENERIC, "this CPU has no AVX2/F16C");
    static const size_t counts[] = {0, 1, 2, 7, 8, 15, 16, 17, 33, 64, 1000, 1027};
    static const size_t offsets[] = {0, 1, 3};
    uint64_t seed = 1;
    for (int op = 0; op < TD_REDUCE_OP_COUNT; op++) {
        for (int dt = 0; dt < TD_DTYPE_COUNT; dt++) {
            if (td_reduce_check((td_reduce_op)op, (td_dtype)dt) != TD_OK)
                continue;
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                for (size_t o = 0; o < sizeof offsets / sizeof offsets[0]; o++) {
                    for (int mode = 0; mode < 4; mode++)
                        check_kernel((td_reduce_op)op, (td_dtype)dt, isa, counts[c], offsets[o], (alias)mode, seed++);
                }
            }
        }
    }
}

TD_TEST(every_pair_matches_reference_baseline) { check_all_pairs(TD_REDUCE_ISA_BASELINE); }
TD_TEST(every_pair_matches_reference_avx2) { check_all_pairs(TD_REDUCE_ISA_AVX2); }

TD_TEST(public_kernel_is_the_best_isa)
{
    td_reduce_isa best = reduce_isa_available(TD_REDUCE_ISA_AVX2) ? TD_REDUCE_ISA_AVX2 : TD_REDUCE_ISA_BASELINE;
    for (int op = 0; op < TD_REDUCE_OP_COUNT; op++) {
        for (int dt = 0; dt < TD_DTYPE_COUNT; dt++) {
            td_reduce_fn fn = td_reduce_kernel((td_reduce_op)op, (td_dtype)dt);
            TD_CHECK(fn == reduce_kernel_isa((td_reduce_op)op, (td_dtype)dt, best));
        }
    }
}

/* ---- invalid pairs -------------------------------------------------------------------------- */

TD_TEST(invalid_pairs_are_rejected_with_a_message)
{
    int invalid = 0;
    for (int op = 0; op < TD_REDUCE_OP_COUNT; op++) {
        for (int dt = 0; dt < TD_DTYPE_COUNT; dt++) {
            bool bitwise = op == TD_BAND || op == TD_BOR || op == TD_BXOR;
            bool ordered = op == TD_MIN || op == TD_MAX;
            bool scaled = op == TD_AVG || op == TD_PREMUL_SUM;
            bool ok = bitwise ? td_dtype_is_integral((td_dtype)dt, true)
                      : ordered ? !td_dtype_is_complex((td_dtype)dt)
                      : scaled ? td_dtype_is_floating((td_dtype)dt) || td_dtype_is_complex((td_dtype)dt)
                               : true;
            td_status st = td_reduce_check((td_reduce_op)op, (td_dtype)dt);
            TD_CHECK_MSG((st == TD_OK) == ok, "%s %s: check says %d", td_reduce_op_name((td_reduce_op)op),
                         td_dtype_name((td_dtype)dt), (int)st);
            if (ok)
                continue;
            invalid++;
            TD_CHECK_EQ(st, TD_ERR_INVALID);
            char want[160];
            snprintf(want, sizeof want, "reduce op %s is not supported for dtype %s", td_reduce_op_name((td_reduce_op)op),
                     td_dtype_name((td_dtype)dt));
            TD_CHECK_CONTAINS(td_last_error(), want);
            TD_CHECK(td_reduce_kernel((td_reduce_op)op, (td_dtype)dt) == NULL);
            TD_CHECK_CONTAINS(td_last_error(), want);
            char buf[32] = {0};
            TD_CHECK_ERR(td_reduce((td_reduce_op)op, (td_dtype)dt, buf, buf, buf, 1), TD_ERR_INVALID, want);
        }
    }
    /* 3 bitwise ops x 6 floating/complex dtypes, MIN/MAX x 2 complex, AVG/PREMUL_SUM x 6 integral. */
    TD_CHECK_EQ(invalid, 18 + 4 + 12);
    TD_CHECK_ERR(td_reduce_check(TD_BAND, TD_FLOAT32), TD_ERR_INVALID,
                 "reduce op BAND is not supported for dtype float32 (bitwise ops need an integer or bool dtype)");
    TD_CHECK_ERR(td_reduce_check(TD_MAX, TD_COMPLEX64), TD_ERR_INVALID,
                 "reduce op MAX is not supported for dtype complex64 (complex numbers are not ordered)");
    TD_CHECK_ERR(td_reduce_check(TD_AVG, TD_INT32), TD_ERR_INVALID,
                 "reduce op AVG is not supported for dtype int32 (AVG needs a floating point or complex dtype)");
    TD_CHECK_ERR(td_reduce_check((td_reduce_op)42, TD_FLOAT32), TD_ERR_INVALID, "invalid reduce op 42");
    TD_CHECK_ERR(td_reduce_check(TD_SUM, (td_dtype)99), TD_ERR_INVALID, "invalid dtype 99");
    TD_CHECK_ERR(td_reduce_check((td_reduce_op)-1, TD_FLOAT32), TD_ERR_INVALID, "invalid reduce op -1");
    float x = 1;
    TD_CHECK_ERR(td_reduce(TD_SUM, TD_FLOAT32, NULL, &x, &x, 1), TD_ERR_INVALID, "NULL buffer");
    TD_CHECK_OK(td_reduce(TD_SUM, TD_FLOAT32, NULL, NULL, NULL, 0));
}

TD_TEST(op_names_round_trip)
{
    static const char *const names[] = {"SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM"};
    for (int op = 0; op < TD_REDUCE_OP_COUNT; op++) {
        TD_CHECK_STR_EQ(td_reduce_op_name((td_reduce_op)op), names[op]);
        td_reduce_op back;
        TD_CHECK_OK(td_reduce_op_from_name(names[op], &back));
        TD_CHECK_EQ(back, op);
    }
    td_reduce_op o;
    TD_CHECK_OK(td_reduce_op_from_name("ReduceOp.MAX", &o));
    TD_CHECK_EQ(o, TD_MAX);
    TD_CHECK_OK(td_reduce_op_from_name("sum", &o));
    TD_CHECK_EQ(o, TD_SUM);
    TD_CHECK_ERR(td_reduce_op_from_name("MEAN", &o), TD_ERR_INVALID, "unknown reduce op 'MEAN'");
    TD_CHECK_STR_EQ(td_reduce_op_name(TD_REDUCE_OP_COUNT), "INVALID_REDUCE_OP");
}

/* ---- specific values, on every ISA ------------------------------------------------------------ */

static int n_isas(td_reduce_isa *isas)
{
    int n = 0;
    isas[n++] = TD_REDUCE_ISA_BASELINE;
    if (reduce_isa_available(TD_REDUCE_ISA_AVX2))
        isas[n++] = TD_REDUCE_ISA_AVX2;
    return n;
}

/* Runs op over one pair replicated 19 times (so vector bodies and scalar tails both see it) and
 * checks every result is `want` (bitwise; want_nan: any NaN). */
static void check_pair16(td_reduce_op op, td_dtype dt, uint16_t x, uint16_t y, uint16_t want, bool want_nan)
{
    td_reduce_isa isas[2];
    int ni = n_isas(isas);
    for (int k = 0; k < ni; k++) {
        uint16_t a[19], b[19], d[19];
        for (int i = 0; i < 19; i++) {
            a[i] = x;
            b[i] = y;
        }
        reduce_kernel_isa(op, dt, isas[k])(d, a, b, 19);
        for (int i = 0; i < 19; i++) {
            float f = dt == TD_FLOAT16 ? td_half_to_float(d[i]) : td_bfloat16_to_float(d[i]);
            bool ok = want_nan ? isnan(f) : d[i] == want;
            TD_CHECK_MSG(ok, "%s %s (%s) of 0x%04x and 0x%04x at %d: got 0x%04x, want 0x%04x%s", td_reduce_op_name(op),
                         td_dtype_name(dt), reduce_isa_name(isas[k]), x, y, i, d[i], want, want_nan ? " (NaN)" : "");
        }
    }
}

TD_TEST(float16_rounds_to_nearest_even_and_overflows_to_inf)
{
    check_pair16(TD_SUM, TD_FLOAT16, 0x3C00, 0x1000, 0x3C00, false); /* 1 + 2^-11: tie, to even 1 */
    check_pair16(TD_SUM, TD_FLOAT16, 0x3C01, 0x1000, 0x3C02, false); /* 1+2^-10 + 2^-11: tie, to even */
    check_pair16(TD_SUM, TD_FLOAT16, 0x3C00, 0x1001, 0x3C01, false); /* just above the tie: up */
    check_pair16(TD_SUM, TD_FLOAT16, 0x7BFF, 0x7BFF, 0x7C00, false); /* 65504 + 65504 = inf */
    check_pair16(TD_SUM, TD_FLOAT16, 0x7BFF, 0x4C00, 0x7C00, false); /* 65504 + 16: tie to inf */
    check_pair16(TD_SUM, TD_FLOAT16, 0x7BFF, 0x4800, 0x7BFF, false); /* 65504 + 8: back to 65504 */
    check_pair16(TD_SUM, TD_FLOAT16, 0x0001, 0x0001, 0x0002, false); /* subnormals add exactly */
    check_pair16(TD_PRODUCT, TD_FLOAT16, 0x0001, 0x3800, 0x0000, false); /* 2^-24 * 0.5: tie to 0 */
    check_pair16(TD_PRODUCT, TD_FLOAT16, 0x0003, 0x3800, 0x0002, false); /* 3 * 2^-25: tie to even 2 */
    check_pair16(TD_PRODUCT, TD_FLOAT16, 0x5C00, 0x5C00, 0x7C00, false); /* 256^2 > 65504 */
    check_pair16(TD_PRODUCT, TD_FLOAT16, 0x5BFF, 0x5BFF, 0x7BFE, false); /* 255.875^2 = 65472 */
    check_pair16(TD_SUM, TD_FLOAT16, 0x7C00, 0xFC00, 0, true);           /* inf + -inf */
    check_pair16(TD_SUM, TD_FLOAT16, 0x7E00, 0x3C00, 0, true);           /* NaN + 1 */
    check_pair16(TD_PRODUCT, TD_FLOAT16, 0x7C00, 0x0000, 0, true);       /* inf * 0 */
}

TD_TEST(bfloat16_rounds_to_nearest_even_and_overflows_to_inf)
{
    check_pair16(TD_SUM, TD_BFLOAT16, 0x3F80, 0x3B80, 0x3F80, false); /* 1 + 2^-8: tie, to even 1 */
    check_pair16(TD_SUM, TD_BFLOAT16, 0x3F81, 0x3B80, 0x3F82, false); /* (1+2^-7) + 2^-8: tie, up to even */
    check_pair16(TD_SUM, TD_BFLOAT16, 0x7F7F, 0x7F7F, 0x7F80, false); /* max + max = inf */
    check_pair16(TD_PRODUCT, TD_BFLOAT16, 0x7F00, 0x4100, 0x7F80, false); /* 2^127 * 8 = inf */
    check_pair16(TD_SUM, TD_BFLOAT16, 0x7F80, 0xFF80, 0, true);
    check_pair16(TD_MAX, TD_BFLOAT16, 0x7FC0, 0x3F80, 0, true);
}

TD_TEST(min_max_propagate_nan_either_side)
{
    td_reduce_isa isas[2];
    int ni = n_isas(isas);
    static const td_dtype dts[] = {TD_FLOAT16, TD_BFLOAT16, TD_FLOAT32, TD_FLOAT64};
    for (int k = 0; k < ni; k++) {
        for (size_t t = 0; t < 4; t++) {
            td_dtype dt = dts[t];
            size_t es = td_dtype_size(dt);
            enum { N = 37 };
            char a[N * 8], b[N * 8], d[N * 8];
            /* NaN on the left at even i, on the right at odd i, both at i % 5 == 0. */
            for (int i = 0; i < N; i++) {
                store_real(dt, a + i * es, i % 2 == 0 || i % 5 == 0 ? NAN : 1.0 + i);
                store_real(dt, b + i * es, i % 2 == 1 || i % 5 == 0 ? NAN : -1.0 - i);
            }
            for (int op = TD_MIN; op <= TD_MAX; op++) {
                for (int mode = 0; mode < 3; mode++) {
                    char aa[N * 8], bb[N * 8];
                    memcpy(aa, a, sizeof a);
                    memcpy(bb, b, sizeof b);
                    char *dst = mode == 0 ? d : mode == 1 ? aa : bb;
                    reduce_kernel_isa((td_reduce_op)op, dt, isas[k])(dst, aa, bb, N);
                    for (int i = 0; i < N; i++)
                        TD_CHECK_MSG(isnan(load_real(dt, dst + i * es)), "%s %s (%s, mode %d): element %d is %g, want NaN",
                                     td_reduce_op_name((td_reduce_op)op), td_dtype_name(dt), reduce_isa_name(isas[k]),
                                     mode, i, load_real(dt, dst + i * es));
                }
            }
            /* Without NaNs, the ordinary answer, infinities included. */
            double xs[4] = {-INFINITY, 2, -0.5, INFINITY}, ys[4] = {1, INFINITY, -3, -INFINITY};
            char x[4 * 8], y[4 * 8], mn[4 * 8], mx[4 * 8];
            for (int i = 0; i < 4; i++) {
                store_real(dt, x + i * es, xs[i]);
                store_real(dt, y + i * es, ys[i]);
            }
            reduce_kernel_isa(TD_MIN, dt, isas[k])(mn, x, y, 4);
            reduce_kernel_isa(TD_MAX, dt, isas[k])(mx, x, y, 4);
            for (int i = 0; i < 4; i++) {
                TD_CHECK(load_real(dt, mn + i * es) == (xs[i] < ys[i] ? xs[i] : ys[i]));
                TD_CHECK(load_real(dt, mx + i * es) == (xs[i] > ys[i] ? xs[i] : ys[i]));
            }
        }
    }
}

TD_TEST(integer_arithmetic_wraps)
{
    td_reduce_isa isas[2];
    int ni = n_isas(isas);
    for (int k = 0; k < ni; k++) {
        td_reduce_isa isa = isas[k];
        int8_t a8[17], b8[17], d8[17];
        uint8_t au[17], bu[17], du[17];
        int16_t a16[17], b16[17], d16[17];
        int32_t a32[17], b32[17], d32[17];
        int64_t a64[17], b64[17], d64[17];
        for (int i = 0; i < 17; i++) {
            a8[i] = 127;
            b8[i] = 1;
            au[i] = 255;
            bu[i] = 2;
            a16[i] = 300;
            b16[i] = 300;
            a32[i] = INT32_MAX;
            b32[i] = 1;
            a64[i] = INT64_MIN;
            b64[i] = -1;
        }
        reduce_kernel_isa(TD_SUM, TD_INT8, isa)(d8, a8, b8, 17);
        reduce_kernel_isa(TD_SUM, TD_UINT8, isa)(du, au, bu, 17);
        reduce_kernel_isa(TD_PRODUCT, TD_INT16, isa)(d16, a16, b16, 17);
        reduce_kernel_isa(TD_SUM, TD_INT32, isa)(d32, a32, b32, 17);
        reduce_kernel_isa(TD_PRODUCT, TD_INT64, isa)(d64, a64, b64, 17);
        for (int i = 0; i < 17; i++) {
            TD_CHECK_EQ(d8[i], -128);
            TD_CHECK_EQ(du[i], 1);
            TD_CHECK_EQ(d16[i], 24464); /* 90000 mod 65536 */
            TD_CHECK_EQ(d32[i], INT32_MIN);
            TD_CHECK(d64[i] == INT64_MIN);
        }
        reduce_kernel_isa(TD_SUM, TD_INT64, isa)(d64, a64, a64, 17); /* MIN + MIN = 0 */
        reduce_kernel_isa(TD_PRODUCT, TD_INT32, isa)(d32, a32, a32, 17); /* MAX^2 = 1 mod 2^32 */
        for (int i = 0; i < 17; i++) {
            TD_CHECK_EQ(d64[i], 0);
            TD_CHECK_EQ(d32[i], 1);
        }
    }
}

TD_TEST(bool_sum_is_or_and_product_is_and)
{
    uint8_t a[4] = {0, 0, 1, 1}, b[4] = {0, 1, 0, 1}, d[4];
    static const struct {
        td_reduce_op op;
        uint8_t want[4];
    } cases[] = {
        {TD_SUM, {0, 1, 1, 1}},  {TD_PRODUCT, {0, 0, 0, 1}}, {TD_MIN, {0, 0, 0, 1}}, {TD_MAX, {0, 1, 1, 1}},
        {TD_BAND, {0, 0, 0, 1}}, {TD_BOR, {0, 1, 1, 1}},     {TD_BXOR, {0, 1, 1, 0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        TD_CHECK_OK(td_reduce(cases[c].op, TD_BOOL, d, a, b, 4));
        TD_CHECK_MSG(memcmp(d, cases[c].want, 4) == 0, "bool %s: got %d %d %d %d", td_reduce_op_name(cases[c].op), d[0],
                     d[1], d[2], d[3]);
    }
}

/* ---- PREMUL_SUM and AVG ---------------------------------------------------------------------- */

TD_TEST(premul_scales_floating_and_complex)
{
    float f[5] = {1, 2, 3, -4, 0.5f}, fo[5];
    TD_CHECK_OK(td_reduce_premul(TD_FLOAT32, fo, f, 5, 0.5));
    for (int i = 0; i < 5; i++)
        TD_CHECK(fo[i] == f[i] * 0.5f);
    TD_CHECK_OK(td_reduce_premul(TD_FLOAT32, f, f, 5, -2)); /* in place */
    TD_CHECK(f[0] == -2 && f[3] == 8 && f[4] == -1);

    double d[3] = {1, 1e300, -3};
    TD_CHECK_OK(td_reduce_premul(TD_FLOAT64, d, d, 3, 1e10));
    TD_CHECK(d[0] == 1e10 && isinf(d[1]) && d[2] == -3e10);

    /* float16: the product rounds once, in float32 then to half. 1/3 is 0x3555. */
    uint16_t h[9], ho[9];
    for (int i = 0; i < 9; i++)
        h[i] = td_float_to_half(1.0f);
    TD_CHECK_OK(td_reduce_premul(TD_FLOAT16, ho, h, 9, 1.0 / 3.0));
    for (int i = 0; i < 9; i++)
        TD_CHECK_EQ(ho[i], 0x3555);
    uint16_t bf[3] = {td_float_to_bfloat16(3.0f), td_float_to_bfloat16(-1.0f), 0x7FC0};
    TD_CHECK_OK(td_reduce_premul(TD_BFLOAT16, bf, bf, 3, 0.25));
    TD_CHECK(td_bfloat16_to_float(bf[0]) == 0.75f && td_bfloat16_to_float(bf[1]) == -0.25f);
    TD_CHECK(isnan(td_bfloat16_to_float(bf[2])));

    float c[4] = {1, -2, 3, 4}; /* (1-2j), (3+4j) */
    TD_CHECK_OK(td_reduce_premul(TD_COMPLEX64, c, c, 2, 2));
    TD_CHECK(c[0] == 2 && c[1] == -4 && c[2] == 6 && c[3] == 8);
    double cd[2] = {1.5, -0.5};
    TD_CHECK_OK(td_reduce_premul(TD_COMPLEX128, cd, cd, 1, 4));
    TD_CHECK(cd[0] == 6 && cd[1] == -2);

    int32_t ints[2] = {1, 2};
    TD_CHECK_ERR(td_reduce_premul(TD_INT32, ints, ints, 2, 2), TD_ERR_INVALID,
                 "reduce op PREMUL_SUM is not supported for dtype int32 (PREMUL_SUM needs a floating point or complex "
                 "dtype)");
    TD_CHECK_ERR(td_reduce_premul(TD_FLOAT32, f + 1, f, 3, 2), TD_ERR_INVALID, "overlap");
    TD_CHECK_OK(td_reduce_premul(TD_FLOAT32, NULL, NULL, 0, 2));
}

TD_TEST(avg_finish_divides_by_world_size)
{
    float f[7] = {2, 4, 6, 1, -3, 0, 9};
    TD_CHECK_OK(td_reduce_finish(TD_AVG, TD_FLOAT32, f, 7, 2));
    TD_CHECK(f[0] == 1 && f[1] == 2 && f[2] == 3 && f[3] == 0.5f && f[4] == -1.5f && f[5] == 0 && f[6] == 4.5f);
    double d[2] = {1, 10};
    TD_CHECK_OK(td_reduce_finish(TD_AVG, TD_FLOAT64, d, 2, 3));
    TD_CHECK(d[0] == 1.0 / 3.0 && d[1] == 10.0 / 3.0); /* a division, not a multiply by 1/3 */
    uint16_t h[2] = {td_float_to_half(3.0f), td_float_to_half(65504.0f)};
    TD_CHECK_OK(td_reduce_finish(TD_AVG, TD_FLOAT16, h, 2, 4));
    TD_CHECK(td_half_to_float(h[0]) == 0.75f && td_half_to_float(h[1]) == 16376.0f);
    double c[2] = {4, -8};
    TD_CHECK_OK(td_reduce_finish(TD_AVG, TD_COMPLEX128, c, 1, 4));
    TD_CHECK(c[0] == 1 && c[1] == -2);

    /* Other ops leave the data alone; invalid combinations fail. */
    int32_t ints[2] = {5, 7};
    TD_CHECK_OK(td_reduce_finish(TD_SUM, TD_INT32, ints, 2, 4));
    TD_CHECK_OK(td_reduce_finish(TD_PREMUL_SUM, TD_FLOAT32, f, 7, 4));
    TD_CHECK(ints[0] == 5 && ints[1] == 7 && f[0] == 1);
    TD_CHECK_ERR(td_reduce_finish(TD_AVG, TD_INT32, ints, 2, 2), TD_ERR_INVALID,
                 "reduce op AVG is not supported for dtype int32");
    TD_CHECK_ERR(td_reduce_finish(TD_AVG, TD_FLOAT32, f, 7, 0), TD_ERR_INVALID, "world_size must be positive, got 0");
    TD_CHECK_ERR(td_reduce_finish(TD_BAND, TD_FLOAT32, f, 7, 2), TD_ERR_INVALID, "reduce op BAND is not supported");
}

/* Long random arrays (vector bodies and tails) against the reference: the product or quotient is
 * rounded to float32 (float64 for float64) and then to the dtype, as the kernels compute it. */
TD_TEST(premul_and_finish_match_reference_on_long_arrays)
{
    static const td_dtype dts[] = {TD_FLOAT16, TD_BFLOAT16, TD_FLOAT32, TD_FLOAT64, TD_COMPLEX64};
    enum { N = 1031 };
    td_reduce_isa isas[2];
    int ni = n_isas(isas);
    for (size_t k = 0; k < ni * sizeof dts / sizeof dts[0]; k++) {
        td_reduce_isa isa = isas[k / (sizeof dts / sizeof dts[0])];
        td_dtype dt = dts[k % (sizeof dts / sizeof dts[0])];
        td_dtype real = dt == TD_COMPLEX64 ? TD_FLOAT32 : dt;
        size_t n = dt == TD_COMPLEX64 ? 2 * N : N, es = td_dtype_size(real);
        char *src = malloc(n * es), *out = malloc(n * es), *want = malloc(n * es);
        TD_CHECK(src && out && want);
        fill_random(real, src, n, 99 + k);
        for (int divide = 0; divide < 2; divide++) {
            double factor = divide ? 3 : 0.3;
            float ff = (float)factor;
            for (size_t i = 0; i < n; i++) {
                double x = load_real(real, src + i * es);
                double r = real == TD_FLOAT64 ? (divide ? x / factor : x * factor)
                                              : (double)(float)(divide ? x / ff : x * (double)ff);
                store_real(real, want + i * es, r);
            }
            memcpy(out, src, n * es);
            if (divide)
                TD_CHECK_OK(reduce_finish_isa(TD_AVG, dt, out, N, 3, isa));
            else
                TD_CHECK_OK(reduce_premul_isa(dt, out, out, N, factor, isa));
            for (size_t i = 0; i < n; i++) {
                TD_CHECK_MSG(same_element(real, out + i * es, want + i * es), "%s %s (%s): element %zu is %g, want %g",
                             divide ? "finish" : "premul", td_dtype_name(dt), reduce_isa_name(isa), i,
                             load_real(real, out + i * es),
                             load_real(real, want + i * es));
            }
        }
        free(src);
        free(out);
        free(want);
    }
}

/* A whole AVG the way a collective does it: reduce world_size inputs as SUM, then finish. */
TD_TEST(avg_over_four_inputs)
{
    enum { N = 45, W = 4 };
    float in[W][N], acc[N];
    for (int r = 0; r < W; r++) {
        for (int i = 0; i < N; i++)
            in[r][i] = (float)(r * 10 + i);
    }
    memcpy(acc, in[0], sizeof acc);
    td_reduce_fn fn = td_reduce_kernel(TD_AVG, TD_FLOAT32);
    TD_CHECK(fn != NULL);
    for (int r = 1; r < W; r++)
        fn(acc, acc, in[r], N);
    TD_CHECK_OK(td_reduce_finish(TD_AVG, TD_FLOAT32, acc, N, W));
    for (int i = 0; i < N; i++)
        TD_CHECK(acc[i] == (float)(15 + i));
}

TD_TEST_MAIN()
