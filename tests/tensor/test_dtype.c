/* dtypes: names and parsing, sizes and categories, torch.promote_types' table, and the 16-bit float
 * conversions against the arithmetic reference of tensor_util.h (every float16 and bfloat16
 * value, and a few million float32 values including every rounding boundary class) and against
 * values torch gives. */
#include <float.h>
#include <math.h>
#include <string.h>

#include <tdist/testing.h>

#include "tensor_util.h"

TD_TEST(names_sizes_and_categories)
{
    static const struct {
        td_dtype dt;
        const char *name;
        size_t size;
        bool floating, complex, integral, integral_or_bool;
    } rows[] = {
        {TD_BOOL, "bool", 1, false, false, false, true},
        {TD_UINT8, "uint8", 1, false, false, true, true},
        {TD_INT8, "int8", 1, false, false, true, true},
        {TD_INT16, "int16", 2, false, false, true, true},
        {TD_INT32, "int32", 4, false, false, true, true},
        {TD_INT64, "int64", 8, false, false, true, true},
        {TD_FLOAT16, "float16", 2, true, false, false, false},
        {TD_BFLOAT16, "bfloat16", 2, true, false, false, false},
        {TD_FLOAT32, "float32", 4, true, false, false, false},
        {TD_FLOAT64, "float64", 8, true, false, false, false},
        {TD_COMPLEX64, "complex64", 8, false, true, false, false},
        {TD_COMPLEX128, "complex128", 16, false, true, false, false},
    };
    TD_CHECK_EQ(sizeof rows / sizeof rows[0], TD_DTYPE_COUNT);
    for (size_t i = 0; i < TD_DTYPE_COUNT; i++) {
        TD_CHECK_EQ(rows[i].dt, i);
        TD_CHECK_STR_EQ(td_dtype_name(rows[i].dt), rows[i].name);
        TD_CHECK_EQ(td_dtype_size(rows[i].dt), rows[i].size);
        TD_CHECK_EQ(td_dtype_is_floating(rows[i].dt), rows[i].floating);
        TD_CHECK_EQ(td_dtype_is_complex(rows[i].dt), rows[i].complex);
        TD_CHECK_EQ(td_dtype_is_integral(rows[i].dt, false), rows[i].integral);
        TD_CHECK_EQ(td_dtype_is_integral(rows[i].dt, true), rows[i].integral_or_bool);
        TD_CHECK(td_dtype_is_valid((int)i));
        td_dtype back;
        TD_CHECK_OK(td_dtype_from_name(rows[i].name, &back));
        TD_CHECK_EQ(back, rows[i].dt);
    }
    TD_CHECK(!td_dtype_is_valid(-1) && !td_dtype_is_valid(TD_DTYPE_COUNT));
    TD_CHECK_EQ(td_dtype_size((td_dtype)77), 0);
    TD_CHECK_STR_EQ(td_dtype_name((td_dtype)77), "invalid dtype");
}

TD_TEST(short_names_and_aliases)
{
    static const struct {
        const char *name;
        td_dtype dt;
    } rows[] = {
        {"f16", TD_FLOAT16}, {"half", TD_FLOAT16}, {"bf16", TD_BFLOAT16}, {"f32", TD_FLOAT32},
        {"float", TD_FLOAT32}, {"f64", TD_FLOAT64}, {"double", TD_FLOAT64}, {"i8", TD_INT8},
        {"i16", TD_INT16}, {"i32", TD_INT32}, {"int", TD_INT32}, {"i64", TD_INT64},
        {"long", TD_INT64}, {"u8", TD_UINT8}, {"c64", TD_COMPLEX64}, {"c128", TD_COMPLEX128},
        {"torch.float32", TD_FLOAT32}, {"torch.bool", TD_BOOL}, {"FLOAT16", TD_FLOAT16},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        td_dtype dt = TD_DTYPE_COUNT;
        TD_CHECK_OK(td_dtype_from_name(rows[i].name, &dt));
        TD_CHECK_MSG(dt == rows[i].dt, "%s parsed as %s", rows[i].name, td_dtype_name(dt));
    }
    td_dtype dt;
    TD_CHECK_ERR(td_dtype_from_name("float128", &dt), TD_ERR_INVALID, "unknown dtype 'float128': expected one of bool");
    TD_CHECK_ERR(td_dtype_from_name("", &dt), TD_ERR_INVALID, "unknown dtype ''");
    TD_CHECK_ERR(td_dtype_from_name(NULL, &dt), TD_ERR_INVALID, "dtype name is NULL");
}

/* torch.promote_types for every pair, as printed by torch 1.13. */
TD_TEST(promotion_matches_torch)
{
    enum { B = TD_BOOL, U8 = TD_UINT8, I8 = TD_INT8, I16 = TD_INT16, I32 = TD_INT32, I64 = TD_INT64,
           F16 = TD_FLOAT16, BF16 = TD_BFLOAT16, F32 = TD_FLOAT32, F64 = TD_FLOAT64, C64 = TD_COMPLEX64,
           C128 = TD_COMPLEX128 };
    static const int table[TD_DTYPE_COUNT][TD_DTYPE_COUNT] = {
        {B, U8, I8, I16, I32, I64, F16, BF16, F32, F64, C64, C128},
        {U8, U8, I16, I16, I32, I64, F16, BF16, F32, F64, C64, C128},
        {I8, I16, I8, I16, I32, I64, F16, BF16, F32, F64, C64, C128},
        {I16, I16, I16, I16, I32, I64, F16, BF16, F32, F64, C64, C128},
        {I32, I32, I32, I32, I32, I64, F16, BF16, F32, F64, C64, C128},
        {I64, I64, I64, I64, I64, I64, F16, BF16, F32, F64, C64, C128},
        {F16, F16, F16, F16, F16, F16, F16, F32, F32, F64, C64, C128},
        {BF16, BF16, BF16, BF16, BF16, BF16, F32, BF16, F32, F64, C64, C128},
        {F32, F32, F32, F32, F32, F32, F32, F32, F32, F64, C64, C128},
        {F64, F64, F64, F64, F64, F64, F64, F64, F64, F64, C128, C128},
        {C64, C64, C64, C64, C64, C64, C64, C64, C64, C128, C64, C128},
        {C128, C128, C128, C128, C128, C128, C128, C128, C128, C128, C128, C128},
    };
    for (int a = 0; a < TD_DTYPE_COUNT; a++) {
        for (int b = 0; b < TD_DTYPE_COUNT; b++) {
            td_dtype got = td_dtype_promote((td_dtype)a, (td_dtype)b);
            TD_CHECK_MSG(got == (td_dtype)table[a][b], "promote(%s, %s) = %s, want %s", td_dtype_name((td_dtype)a),
                         td_dtype_name((td_dtype)b), td_dtype_name(got), td_dtype_name((td_dtype)table[a][b]));
        }
    }
}

static bool same_float(double a, double b) { return (isnan(a) && isnan(b)) || (a == b && signbit(a) == signbit(b)); }

TD_TEST(every_half_and_bfloat16_decodes_exactly)
{
    for (uint32_t h = 0; h < 65536; h++) {
        double want = ref_h2f((uint16_t)h);
        double got = td_half_to_float((uint16_t)h);
        TD_CHECK_MSG(same_float(got, want), "half 0x%04x -> %.17g, want %.17g", h, got, want);
        /* Every non-NaN half survives the round trip; NaNs stay NaN (quieted, sign kept). */
        uint16_t back = td_float_to_half((float)got);
        if (isnan(want))
            TD_CHECK_MSG((back & 0x7C00) == 0x7C00 && (back & 0x3FF) && (back & 0x8000) == (h & 0x8000),
                         "NaN 0x%04x -> 0x%04x", h, back);
        else
            TD_CHECK_MSG(back == h, "half 0x%04x round trip gives 0x%04x", h, back);

        want = ref_bf2f((uint16_t)h);
        got = td_bfloat16_to_float((uint16_t)h);
        TD_CHECK_MSG(same_float(got, want), "bfloat16 0x%04x -> %.17g, want %.17g", h, got, want);
        back = td_float_to_bfloat16((float)got);
        if (isnan(want))
            TD_CHECK_MSG(back == 0x7FC0, "bfloat16 NaN 0x%04x -> 0x%04x", h, back);
        else
            TD_CHECK_MSG(back == h, "bfloat16 0x%04x round trip gives 0x%04x", h, back);
    }
}

static void check_encode(float f)
{
    uint16_t h = td_float_to_half(f), want = ref_f2h(f);
    if (isnan(f))
        TD_CHECK_MSG((h & 0x7FFF) == 0x7E00, "half(NaN) = 0x%04x", h);
    else
        TD_CHECK_MSG(h == want, "half(%.9g) = 0x%04x, want 0x%04x", (double)f, h, want);
    uint16_t b = td_float_to_bfloat16(f), wantb = ref_f2bf(f);
    if (isnan(f))
        TD_CHECK_MSG(b == 0x7FC0, "bfloat16(NaN) = 0x%04x", b);
    else
        TD_CHECK_MSG(b == wantb, "bfloat16(%.9g) = 0x%04x, want 0x%04x", (double)f, b, wantb);
}

TD_TEST(float_to_16_bit_rounds_to_nearest_even)
{
    /* Each half value, and the float32 values around the midpoints to its neighbours: the exact
     * tie and one float32 ulp either side. Same for bfloat16. */
    for (uint32_t h = 0; h < 0x7C00; h++) {
        for (int s = 0; s < 2; s++) {
            double lo = ref_h2f((uint16_t)h), hi = h + 1 < 0x7C00 ? ref_h2f((uint16_t)(h + 1)) : 65536.0;
            float mid = (float)((lo + hi) / 2);
            float sign = s ? -1.0f : 1.0f;
            check_encode(sign * (float)lo);
            check_encode(sign * mid);
            check_encode(sign * nextafterf(mid, 0));
            check_encode(sign * nextafterf(mid, INFINITY));
        }
    }
    for (uint32_t b = 0; b < 0x7F80; b += 1) {
        double lo = ref_bf2f((uint16_t)b), hi = ref_bf2f((uint16_t)(b + 1));
        float mid = (float)((lo + hi) / 2);
        check_encode(mid);
        check_encode(-nextafterf(mid, 0));
        check_encode(nextafterf(mid, INFINITY));
    }
    /* Random float32 bit patterns. */
    uint64_t s = 42;
    for (int i = 0; i < 1000000; i++) {
        uint32_t bits = (uint32_t)rng_next(&s);
        float f;
        memcpy(&f, &bits, 4);
        check_encode(f);
    }
    check_encode(INFINITY);
    check_encode(-INFINITY);
    check_encode(NAN);
    check_encode(FLT_MAX);
    check_encode(-0.0f);
}

/* Values from torch 1.13: torch.tensor([...]).half().view(torch.int16) and .bfloat16(). */
TD_TEST(conversions_match_torch)
{
    static const struct {
        float f;
        uint16_t h;
    } halves[] = {
        {65519.0f, 31743}, {65520.0f, 31744}, {1e-8f, 0}, {0x1p-24f, 1}, {0x1p-25f, 0},
        {3 * 0x1p-25f, 2}, {1.0009765625f + 0x1p-11f, 15362}, {0.1f, 11878},
    };
    for (size_t i = 0; i < sizeof halves / sizeof halves[0]; i++)
        TD_CHECK_MSG(td_float_to_half(halves[i].f) == halves[i].h, "half(%.9g) = %d, torch says %d",
                     (double)halves[i].f, td_float_to_half(halves[i].f), halves[i].h);
    static const struct {
        float f;
        uint16_t b;
    } bfs[] = {{1.0f + 0x1p-8f, 16256}, {1.0f + 3 * 0x1p-8f, 16258}, {3.4e38f, 32640}, {1e-40f, 1}};
    for (size_t i = 0; i < sizeof bfs / sizeof bfs[0]; i++)
        TD_CHECK_MSG(td_float_to_bfloat16(bfs[i].f) == bfs[i].b, "bfloat16(%.9g) = %d, torch says %d",
                     (double)bfs[i].f, td_float_to_bfloat16(bfs[i].f), bfs[i].b);
    TD_CHECK(td_half_to_float(0x7C00) == INFINITY && td_half_to_float(0xFC00) == -INFINITY);
    TD_CHECK(isnan(td_half_to_float(0x7E00)) && isnan(td_bfloat16_to_float(0xFFC1)));
    TD_CHECK(td_half_to_float(0x0001) == 0x1p-24f && td_half_to_float(0x7BFF) == 65504.0f);
    TD_CHECK(td_bfloat16_to_float(0x3F80) == 1.0f);
}

TD_TEST_MAIN()
