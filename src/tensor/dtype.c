/* dtypes: names, sizes, categories, torch.promote_types, and the public 16-bit float conversions.
 *
 * The element types behind each dtype are fixed here and in dtype.h; everything else in the tensor
 * layer (copy, printing, reduce kernels, the value codec) dispatches on td_dtype through these. */
#include "tensor/dtype.h"

#include <string.h>
#include <strings.h>

#include "base/error.h"
#include "tensor/half.h"

static const char *const dtype_names[TD_DTYPE_COUNT] = {
    "bool",    "uint8",    "int8",    "int16",   "int32",     "int64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
};

const size_t dtype_sizes[TD_DTYPE_COUNT] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 8, 16};

bool td_dtype_is_valid(int dtype) { return dtype >= 0 && dtype < TD_DTYPE_COUNT; }

const char *td_dtype_name(td_dtype dtype)
{
    return td_dtype_is_valid((int)dtype) ? dtype_names[dtype] : "invalid dtype";
}

size_t td_dtype_size(td_dtype dtype) { return dtype_size_of(dtype); }

bool td_dtype_is_floating(td_dtype dtype)
{
    return dtype == TD_FLOAT16 || dtype == TD_BFLOAT16 || dtype == TD_FLOAT32 || dtype == TD_FLOAT64;
}

bool td_dtype_is_complex(td_dtype dtype) { return dtype == TD_COMPLEX64 || dtype == TD_COMPLEX128; }

bool td_dtype_is_integral(td_dtype dtype, bool include_bool)
{
    if (dtype == TD_BOOL)
        return include_bool;
    return dtype >= TD_UINT8 && dtype <= TD_INT64;
}

static const struct {
    const char *name;
    td_dtype dtype;
} dtype_aliases[] = {
    {"f16", TD_FLOAT16},     {"half", TD_FLOAT16},     {"bf16", TD_BFLOAT16},   {"f32", TD_FLOAT32},
    {"float", TD_FLOAT32},   {"f64", TD_FLOAT64},      {"double", TD_FLOAT64},  {"i8", TD_INT8},
    {"char", TD_INT8},       {"i16", TD_INT16},        {"short", TD_INT16},     {"i32", TD_INT32},
    {"int", TD_INT32},       {"i64", TD_INT64},        {"long", TD_INT64},      {"u8", TD_UINT8},
    {"byte", TD_UINT8},      {"c64", TD_COMPLEX64},    {"cfloat", TD_COMPLEX64}, {"c128", TD_COMPLEX128},
    {"cdouble", TD_COMPLEX128},
};

td_status td_dtype_from_name(const char *name, td_dtype *out)
{
    if (!name)
        return error_fmt(TD_ERR_INVALID, "dtype name is NULL");
    /* "torch.float32", as str(dtype) prints in PyTorch, is accepted too. */
    const char *n = strncmp(name, "torch.", 6) == 0 ? name + 6 : name;
    for (int i = 0; i < TD_DTYPE_COUNT; i++) {
        if (strcasecmp(n, dtype_names[i]) == 0) {
            *out = (td_dtype)i;
            return TD_OK;
        }
    }
    for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++) {
        if (strcasecmp(n, dtype_aliases[i].name) == 0) {
            *out = dtype_aliases[i].dtype;
            return TD_OK;
        }
    }
    return error_fmt(TD_ERR_INVALID,
                    "unknown dtype '%s': expected one of bool, uint8, int8, int16, int32, int64, float16, "
                    "bfloat16, float32, float64, complex64, complex128 (or f16, bf16, f32, f64, i8..i64, u8, "
                    "c64, c128, half, float, double, int, long)",
                    name);
}

td_dtype td_dtype_promote(td_dtype a, td_dtype b)
{
    if (a == b)
        return a;
    if (a == TD_BOOL)
        return b;
    if (b == TD_BOOL)
        return a;
    bool ca = td_dtype_is_complex(a), cb = td_dtype_is_complex(b);
    if (ca && cb)
        return TD_COMPLEX128;
    if (ca || cb) {
        td_dtype c = ca ? a : b, other = ca ? b : a;
        return other == TD_FLOAT64 ? TD_COMPLEX128 : c;
    }
    bool fa = td_dtype_is_floating(a), fb = td_dtype_is_floating(b);
    if (fa && fb) {
        if (td_dtype_size(a) == 2 && td_dtype_size(b) == 2)
            return TD_FLOAT32; /* float16 with bfloat16: neither holds the other */
        return td_dtype_size(a) >= td_dtype_size(b) ? a : b;
    }
    if (fa || fb)
        return fa ? a : b;
    /* Two integer types. uint8 with int8 needs int16 to hold both ranges. */
    if (a == TD_UINT8 || b == TD_UINT8) {
        td_dtype other = a == TD_UINT8 ? b : a;
        return other == TD_INT8 ? TD_INT16 : other;
    }
    return td_dtype_size(a) >= td_dtype_size(b) ? a : b;
}

float td_half_to_float(uint16_t h) { return h2f(h); }
uint16_t td_float_to_half(float f) { return f2h(f); }
float td_bfloat16_to_float(uint16_t b) { return bf2f(b); }
uint16_t td_float_to_bfloat16(float f) { return f2bf(f); }

td_status dtype_check(int dtype)
{
    if (!td_dtype_is_valid(dtype))
        return error_fmt(TD_ERR_INVALID, "invalid dtype %d (expected a td_dtype from 0 to %d)", dtype,
                        TD_DTYPE_COUNT - 1);
    return TD_OK;
}
