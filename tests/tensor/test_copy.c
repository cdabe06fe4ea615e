/* Data movement: copy across every dtype pair (PyTorch's conversion rules, checked against values
 * torch 1.13 gives) and across layouts (transposed, expanded, narrowed, offset, overlapping),
 * broadcasting and its errors, fill, read/write, element get/set, and equal/allclose. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/testing.h>

#include "tensor_util.h"

/* Source values that every dtype holds exactly (as its own rounding of them), so the expected
 * destination follows from the rules alone. */
static const double sample[] = {0, 1, -1, 2.5, -2.75, 100, 127, -128, 255, 3.0e4, -0.5};
enum { NS = sizeof sample / sizeof sample[0] };

/* The value a src element of dtype sdt holds for sample v (the source's own conversion). */
static void make_source(td_dtype sdt, void *p, double v, double im)
{
    if (td_dtype_is_integral(sdt, true)) {
        int64_t i = sdt == TD_BOOL ? v != 0 : (int64_t)v;
        memcpy(p, &i, td_dtype_size(sdt)); /* little-endian low bytes: wraps as a cast does */
    } else if (td_dtype_is_complex(sdt)) {
        size_t h = td_dtype_size(sdt) / 2;
        if (h == 4) {
            float c[2] = {(float)v, (float)im};
            memcpy(p, c, 8);
        } else {
            double c[2] = {v, im};
            memcpy(p, c, 16);
        }
    } else {
        store_real(sdt, p, v);
    }
}

/* PyTorch's rules, on the value (re, im) the source holds. */
static void expected(td_dtype ddt, void *p, td_dtype sdt, const void *src)
{
    double re, im;
    if (td_dtype_is_integral(sdt, true)) {
        re = (double)load_int(sdt, src);
        im = 0;
    } else {
        load_complex(sdt, src, &re, &im);
    }
    if (ddt == TD_BOOL) {
        *(uint8_t *)p = re != 0 || im != 0;
    } else if (td_dtype_is_integral(ddt, false)) {
        int64_t i = td_dtype_is_integral(sdt, true) ? load_int(sdt, src) : (int64_t)trunc(re);
        memcpy(p, &i, td_dtype_size(ddt));
    } else if (td_dtype_is_complex(ddt)) {
        if (ddt == TD_COMPLEX64) {
            float c[2] = {(float)re, (float)im};
            memcpy(p, c, 8);
        } else {
            double c[2] = {re, im};
            memcpy(p, c, 16);
        }
    } else {
        store_real(ddt, p, ddt == TD_FLOAT64 ? re : (double)(float)re); /* via float32, as torch */
    }
}

TD_TEST(copy_converts_between_every_dtype_pair)
{
    for (int s = 0; s < TD_DTYPE_COUNT; s++) {
        td_dtype sdt = (td_dtype)s;
        size_t ses = td_dtype_size(sdt);
        char raw[NS * 16];
        for (int i = 0; i < NS; i++)
            make_source(sdt, raw + i * ses, sample[i], i % 3 == 0 ? 0.0 : -sample[i] / 2);
        td_tensor *src;
        TD_CHECK_OK(td_tensor_from_buffer(sdt, TD_SHAPE(NS), raw, &src));
        for (int d = 0; d < TD_DTYPE_COUNT; d++) {
            td_dtype ddt = (td_dtype)d;
            size_t des = td_dtype_size(ddt);
            td_tensor *dst;
            TD_CHECK_OK(td_tensor_zeros(ddt, TD_SHAPE(NS), &dst));
            TD_CHECK_OK(td_tensor_copy(dst, src));
            char got[NS * 16];
            TD_CHECK_OK(td_tensor_read(dst, got, NS * des));
            for (int i = 0; i < NS; i++) {
                char want[16];
                expected(ddt, want, sdt, raw + i * ses);
                if (memcmp(got + i * des, want, des) != 0) {
                    char g[64], w[64], sv[64];
                    describe_element(ddt, got + i * des, g, sizeof g);
                    describe_element(ddt, want, w, sizeof w);
                    describe_element(sdt, raw + i * ses, sv, sizeof sv);
                    TD_FAIL("copy %s -> %s of %s gave %s, want %s", td_dtype_name(sdt), td_dtype_name(ddt), sv, g, w);
                }
            }
            /* td_tensor_to agrees with copy. */
            td_tensor *conv;
            TD_CHECK_OK(td_tensor_to(src, ddt, &conv));
            TD_CHECK(td_tensor_equal(conv, dst) || td_dtype_is_floating(ddt) || td_dtype_is_complex(ddt));
            TD_CHECK(td_tensor_allclose(conv, dst, 0, 0, true));
            td_tensor_release(conv);
            td_tensor_release(dst);
        }
        td_tensor_release(src);
    }
}

/* torch.tensor([-2.7, -0.5, 0.5, 2.7, 300.5, -300.5, nan, inf, 1e20]).to(dtype), torch 1.13 on x86. */
TD_TEST(out_of_range_floats_convert_as_torch_does)
{
    static const double in[9] = {-2.7, -0.5, 0.5, 2.7, 300.5, -300.5, NAN, INFINITY, 1e20};
    static const struct {
        td_dtype dt;
        int64_t want[9];
    } rows[] = {
        {TD_UINT8, {254, 0, 0, 2, 44, 212, 0, 0, 0}},
        {TD_INT8, {-2, 0, 0, 2, 44, -44, 0, 0, 0}},
        {TD_INT16, {-2, 0, 0, 2, 300, -300, 0, 0, 0}},
        {TD_INT32, {-2, 0, 0, 2, 300, -300, INT32_MIN, INT32_MIN, INT32_MIN}},
        {TD_INT64, {-2, 0, 0, 2, 300, -300, INT64_MIN, INT64_MIN, INT64_MIN}},
        {TD_BOOL, {1, 1, 1, 1, 1, 1, 1, 1, 1}},
    };
    td_tensor *f32, *f64;
    TD_CHECK_OK(td_tensor_from_buffer(TD_FLOAT64, TD_SHAPE(9), in, &f64));
    TD_CHECK_OK(td_tensor_to(f64, TD_FLOAT32, &f32));
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        for (int k = 0; k < 2; k++) {
            td_tensor *t;
            TD_CHECK_OK(td_tensor_to(k ? f64 : f32, rows[r].dt, &t));
            for (int64_t i = 0; i < 9; i++) {
                int64_t v;
                TD_CHECK_OK(td_tensor_get_i64(t, &i, &v));
                TD_CHECK_MSG(v == rows[r].want[i], "%s(%g) = %lld, torch gives %lld", td_dtype_name(rows[r].dt), in[i],
                             (long long)v, (long long)rows[r].want[i]);
            }
            td_tensor_release(t);
        }
    }
    td_tensor_release(f32);
    td_tensor_release(f64);

    /* Complex to real drops the imaginary part; to bool looks at both. */
    double c[4] = {-1.5, 2, 0, 0.5};
    td_tensor *ct, *t;
    TD_CHECK_OK(td_tensor_from_buffer(TD_COMPLEX128, TD_SHAPE(2), c, &ct));
    TD_CHECK_OK(td_tensor_to(ct, TD_INT32, &t));
    TD_CHECK(value_at(t, 0) == -1 && value_at(t, 1) == 0);
    td_tensor_release(t);
    TD_CHECK_OK(td_tensor_to(ct, TD_BOOL, &t));
    TD_CHECK(value_at(t, 0) == 1 && value_at(t, 1) == 1);
    td_tensor_release(t);
    TD_CHECK_OK(td_tensor_to(ct, TD_FLOAT16, &t));
    TD_CHECK(value_at(t, 0) == -1.5 && value_at(t, 1) == 0);
    td_tensor_release(t);
    td_tensor_release(ct);
}

/* Every element of dst equals src's at the same index (as doubles). */
static void check_same_values(const td_tensor *dst, const td_tensor *src)
{
    int64_t n = td_tensor_numel(dst);
    TD_CHECK_EQ(n, td_tensor_numel(src));
    for (int64_t i = 0; i < n; i++)
        TD_CHECK_MSG(value_at(dst, i) == value_at(src, i), "element %lld: %g vs %g", (long long)i, value_at(dst, i),
                     value_at(src, i));
}

TD_TEST(copy_between_layouts)
{
    td_tensor *a, *m, *mt, *dst, *sub;
    TD_CHECK_OK(td_tensor_arange(TD_FLOAT32, 0, 60, 1, &a));
    TD_CHECK_OK(td_tensor_view(a, TD_SHAPE(3, 4, 5), &m));
    int perm[3] = {2, 0, 1};
    TD_CHECK_OK(td_tensor_permute(m, perm, 3, &mt)); /* [5, 3, 4], strides [1, 20, 5] */

    /* Permuted into contiguous, in each of several dtypes. */
    static const td_dtype dts[] = {TD_FLOAT32, TD_FLOAT64, TD_INT16, TD_FLOAT16, TD_COMPLEX64};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        TD_CHECK_OK(td_tensor_zeros(dts[k], TD_SHAPE(5, 3, 4), &dst));
        TD_CHECK_OK(td_tensor_copy(dst, mt));
        check_same_values(dst, mt);
        td_tensor_release(dst);
    }

    /* Contiguous into a permuted destination (a transposed view of a bigger buffer). */
    td_tensor *big, *bigt;
    TD_CHECK_OK(td_tensor_zeros(TD_INT64, TD_SHAPE(4, 3, 5), &big));
    int perm2[3] = {2, 1, 0};
    TD_CHECK_OK(td_tensor_permute(big, perm2, 3, &bigt)); /* [5, 3, 4] */
    td_tensor *src;
    TD_CHECK_OK(td_tensor_contiguous(mt, &src));
    TD_CHECK_OK(td_tensor_copy(bigt, src));
    check_same_values(bigt, mt);
    td_tensor_release(src);

    /* Narrowed with an offset into narrowed with another offset. */
    td_tensor *n1, *n2;
    TD_CHECK_OK(td_tensor_narrow(m, 2, 1, 3, &n1));   /* [3, 4, 3] offset 1 */
    TD_CHECK_OK(td_tensor_narrow(big, 2, 2, 3, &sub)); /* [4, 3, 3] offset 2 */
    TD_CHECK_OK(td_tensor_transpose(sub, 0, 1, &n2));  /* [3, 4, 3] */
    TD_CHECK_OK(td_tensor_copy(n2, n1));
    check_same_values(n2, n1);
    /* Untouched elements of big outside the narrow keep what the previous copy put there. */
    int64_t idx[3] = {0, 0, 0};
    int64_t v;
    TD_CHECK_OK(td_tensor_get_i64(big, idx, &v));
    TD_CHECK_EQ(v, 0); /* bigt[0][0][0] = mt[0][0][0] = m[0][0][0] = 0 */
    idx[2] = 1;
    TD_CHECK_OK(td_tensor_get_i64(big, idx, &v));
    TD_CHECK_EQ(v, 1);

    /* A selected (0-dim) element into a 0-dim tensor, and back. */
    td_tensor *e, *s0;
    TD_CHECK_OK(td_tensor_select(a, 0, 17, &e));
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT64, TD_SHAPE_SCALAR, &s0));
    TD_CHECK_OK(td_tensor_copy(s0, e));
    double d;
    TD_CHECK_OK(td_tensor_get_f64(s0, NULL, &d));
    TD_CHECK(d == 17);
    td_tensor_release(e);
    td_tensor_release(s0);

    td_tensor_release(n1);
    td_tensor_release(n2);
    td_tensor_release(sub);
    td_tensor_release(big);
    td_tensor_release(bigt);
    td_tensor_release(mt);
    td_tensor_release(m);
    td_tensor_release(a);
}

/* Big enough that the copy walks transposed operands in tiles (sizes not multiples of the tile). */
TD_TEST(transposed_copies_of_larger_tensors)
{
    enum { B = 3, R = 70, C = 101 };
    td_tensor *a, *m, *mt;
    TD_CHECK_OK(td_tensor_arange(TD_INT32, 0, B * R * C, 1, &a));
    TD_CHECK_OK(td_tensor_view(a, TD_SHAPE(B, R, C), &m));
    int perm[3] = {0, 2, 1};
    TD_CHECK_OK(td_tensor_permute(m, perm, 3, &mt)); /* [B, C, R] */
    static const td_dtype dts[] = {TD_INT32, TD_INT64, TD_FLOAT32, TD_FLOAT64};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        td_tensor *dst;
        TD_CHECK_OK(td_tensor_zeros(dts[k], TD_SHAPE(B, C, R), &dst));
        TD_CHECK_OK(td_tensor_copy(dst, mt));
        for (int64_t b = 0; b < B; b++) {
            for (int64_t c = 0; c < C; c++) {
                for (int64_t r = 0; r < R; r++) {
                    int64_t idx[3] = {b, c, r}, v;
                    TD_CHECK_OK(td_tensor_get_i64(dst, idx, &v));
                    TD_CHECK_MSG(v == (b * R + r) * C + c, "%s [%lld, %lld, %lld] = %lld", td_dtype_name(dts[k]),
                                 (long long)b, (long long)c, (long long)r, (long long)v);
                }
            }
        }
        /* And back, from contiguous into the transposed view of a fresh buffer. */
        td_tensor *back, *backv, *backt;
        TD_CHECK_OK(td_tensor_zeros(TD_INT32, TD_SHAPE(B * R * C), &back));
        TD_CHECK_OK(td_tensor_view(back, TD_SHAPE(B, R, C), &backv));
        TD_CHECK_OK(td_tensor_permute(backv, perm, 3, &backt));
        TD_CHECK_OK(td_tensor_copy(backt, dst));
        TD_CHECK(td_tensor_equal(back, a));
        td_tensor_release(backt);
        td_tensor_release(backv);
        td_tensor_release(back);
        td_tensor_release(dst);
    }
    td_tensor *c;
    TD_CHECK_OK(td_tensor_contiguous(mt, &c));
    TD_CHECK(td_tensor_equal(c, mt));
    td_tensor_release(c);
    td_tensor_release(mt);
    td_tensor_release(m);
    td_tensor_release(a);
}

TD_TEST(copy_broadcasts_the_source)
{
    td_tensor *row, *dst, *col, *sc;
    double r[4] = {1, 2, 3, 4};
    TD_CHECK_OK(td_tensor_from_buffer(TD_FLOAT64, TD_SHAPE(4), r, &row));
    TD_CHECK_OK(td_tensor_zeros(TD_INT32, TD_SHAPE(3, 4), &dst));
    TD_CHECK_OK(td_tensor_copy(dst, row));
    for (int i = 0; i < 12; i++)
        TD_CHECK(value_at(dst, i) == r[i % 4]);
    TD_CHECK_OK(td_tensor_view(row, TD_SHAPE(4, 1), &col));
    td_tensor *dst2;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(2, 4, 3), &dst2));
    TD_CHECK_OK(td_tensor_copy(dst2, col));
    for (int i = 0; i < 24; i++)
        TD_CHECK(value_at(dst2, i) == r[(i / 3) % 4]);
    TD_CHECK_OK(td_tensor_full(TD_FLOAT32, TD_SHAPE_SCALAR, 9, &sc));
    TD_CHECK_OK(td_tensor_copy(dst2, sc));
    TD_CHECK(value_at(dst2, 23) == 9);

    TD_CHECK_ERR(td_tensor_copy(dst, col), TD_ERR_INVALID,
                 "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 0");
    td_tensor *three, *one3;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(3), &three));
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(1, 3), &one3));
    TD_CHECK_ERR(td_tensor_copy(three, one3), TD_ERR_INVALID,
                 "output with shape [3] doesn't match the broadcast shape [1, 3]");
    TD_CHECK_ERR(td_tensor_copy(three, row), TD_ERR_INVALID,
                 "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 0");
    td_tensor *one, *exp3;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(1), &one));
    TD_CHECK_ERR(td_tensor_copy(one, three), TD_ERR_INVALID,
                 "output with shape [1] doesn't match the broadcast shape [3]");
    TD_CHECK_OK(td_tensor_expand(one, TD_SHAPE(3), &exp3));
    TD_CHECK_ERR(td_tensor_copy(exp3, three), TD_ERR_INVALID,
                 "unsupported operation: more than one element of the written-to tensor refers to a single memory "
                 "location. Please clone() the tensor before performing the operation.");
    TD_CHECK_OK(td_tensor_fill(exp3, 5)); /* fill writes one value: allowed, as torch's fill_ */
    TD_CHECK(value_at(one, 0) == 5);
    td_tensor_release(exp3);
    td_tensor_release(one);
    td_tensor_release(three);
    td_tensor_release(one3);
    td_tensor_release(sc);
    td_tensor_release(dst2);
    td_tensor_release(col);
    td_tensor_release(dst);
    td_tensor_release(row);
}

TD_TEST(overlapping_copies_read_the_source_first)
{
    td_tensor *a, *lo, *hi;
    TD_CHECK_OK(td_tensor_arange(TD_INT32, 0, 10, 1, &a));
    TD_CHECK_OK(td_tensor_narrow(a, 0, 0, 8, &lo));
    TD_CHECK_OK(td_tensor_narrow(a, 0, 2, 8, &hi));
    TD_CHECK_OK(td_tensor_copy(hi, lo)); /* shift right by 2 */
    static const double want[10] = {0, 1, 0, 1, 2, 3, 4, 5, 6, 7};
    for (int i = 0; i < 10; i++)
        TD_CHECK(value_at(a, i) == want[i]);
    TD_CHECK_OK(td_tensor_copy(lo, hi)); /* and back left */
    static const double want2[10] = {0, 1, 2, 3, 4, 5, 6, 7, 6, 7};
    for (int i = 0; i < 10; i++)
        TD_CHECK(value_at(a, i) == want2[i]);
    /* A transpose of itself through the same memory. */
    td_tensor *sq, *sqt, *ref;
    TD_CHECK_OK(td_tensor_arange(TD_FLOAT64, 0, 9, 1, &sq));
    td_tensor *m;
    TD_CHECK_OK(td_tensor_view(sq, TD_SHAPE(3, 3), &m));
    TD_CHECK_OK(td_tensor_transpose(m, 0, 1, &sqt));
    TD_CHECK_OK(td_tensor_clone(sqt, &ref));
    TD_CHECK_OK(td_tensor_copy(m, sqt));
    TD_CHECK(td_tensor_equal(m, ref));
    TD_CHECK_OK(td_tensor_copy(m, m)); /* the same view: nothing to do */
    TD_CHECK(td_tensor_equal(m, ref));
    td_tensor_release(ref);
    td_tensor_release(sqt);
    td_tensor_release(m);
    td_tensor_release(sq);
    td_tensor_release(hi);
    td_tensor_release(lo);
    td_tensor_release(a);
}

TD_TEST(fill_and_fill_complex)
{
    td_tensor *a, *v;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT16, TD_SHAPE(4, 5), &a));
    TD_CHECK_OK(td_tensor_narrow(a, 1, 1, 3, &v));
    TD_CHECK_OK(td_tensor_fill(v, 0.1));
    double h = (double)td_half_to_float(td_float_to_half(0.1f));
    for (int i = 0; i < 20; i++)
        TD_CHECK(value_at(a, i) == ((i % 5 >= 1 && i % 5 <= 3) ? h : 0));
    td_tensor_release(v);
    td_tensor_release(a);

    TD_CHECK_OK(td_tensor_zeros(TD_COMPLEX64, TD_SHAPE(3), &a));
    TD_CHECK_OK(td_tensor_fill_complex(a, 1.5, -2));
    int64_t i = 2;
    double re, im;
    TD_CHECK_OK(td_tensor_get_complex(a, &i, &re, &im));
    TD_CHECK(re == 1.5 && im == -2);
    td_tensor_release(a);
    TD_CHECK_OK(td_tensor_zeros(TD_UINT8, TD_SHAPE(3), &a));
    TD_CHECK_OK(td_tensor_fill_complex(a, 7.9, 3)); /* imaginary part dropped, truncated */
    TD_CHECK(value_at(a, 1) == 7);
    TD_CHECK_OK(td_tensor_fill(a, -1)); /* wraps */
    TD_CHECK(value_at(a, 0) == 255);
    td_tensor_release(a);
    TD_CHECK_ERR(td_tensor_fill(NULL, 1), TD_ERR_INVALID, "tensor is NULL");
}

TD_TEST(read_and_write_in_row_major_order)
{
    td_tensor *a, *t;
    TD_CHECK_OK(td_tensor_arange(TD_INT16, 0, 6, 1, &a));
    td_tensor *m;
    TD_CHECK_OK(td_tensor_view(a, TD_SHAPE(2, 3), &m));
    TD_CHECK_OK(td_tensor_transpose(m, 0, 1, &t));
    int16_t out[6];
    TD_CHECK_OK(td_tensor_read(t, out, sizeof out));
    static const int16_t want[6] = {0, 3, 1, 4, 2, 5};
    TD_CHECK(memcmp(out, want, sizeof out) == 0);
    int16_t in[6] = {10, 11, 12, 13, 14, 15};
    TD_CHECK_OK(td_tensor_write(t, in, sizeof in));
    /* t[i][j] = in[i*2+j], so m[j][i] = in[i*2+j]. */
    static const double wm[6] = {10, 12, 14, 11, 13, 15};
    for (int i = 0; i < 6; i++)
        TD_CHECK(value_at(m, i) == wm[i]);
    /* Unaligned user buffers are fine. */
    char buf[13];
    TD_CHECK_OK(td_tensor_read(t, buf + 1, 12));
    TD_CHECK_OK(td_tensor_write(m, buf + 1, 12));
    TD_CHECK(value_at(m, 1) == 11);
    TD_CHECK_ERR(td_tensor_read(t, out, 10), TD_ERR_INVALID,
                 "td_tensor_read: the buffer has 10 bytes but the tensor holds 12 (6 elements of int16)");
    TD_CHECK_ERR(td_tensor_write(t, NULL, 12), TD_ERR_INVALID, "buffer is NULL");
    td_tensor *e;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(0), &e));
    TD_CHECK_OK(td_tensor_read(e, NULL, 0));
    TD_CHECK_OK(td_tensor_write(e, NULL, 0));
    td_tensor_release(e);
    td_tensor_release(t);
    td_tensor_release(m);
    td_tensor_release(a);
}

TD_TEST(get_and_set_elements)
{
    for (int d = 0; d < TD_DTYPE_COUNT; d++) {
        td_dtype dt = (td_dtype)d;
        td_tensor *t;
        TD_CHECK_OK(td_tensor_zeros(dt, TD_SHAPE(2, 3), &t));
        int64_t idx[2] = {1, -1}; /* negative indices count from the end */
        TD_CHECK_OK(td_tensor_set_f64(t, idx, 1));
        int64_t i;
        double v, re, im;
        int64_t flat[2] = {1, 2};
        TD_CHECK_OK(td_tensor_get_i64(t, flat, &i));
        TD_CHECK_OK(td_tensor_get_f64(t, flat, &v));
        TD_CHECK_OK(td_tensor_get_complex(t, flat, &re, &im));
        TD_CHECK_MSG(i == 1 && v == 1 && re == 1 && im == 0, "%s: %lld %g %g %g", td_dtype_name(dt), (long long)i, v, re, im);
        TD_CHECK_OK(td_tensor_set_i64(t, idx, 0));
        TD_CHECK_OK(td_tensor_get_f64(t, flat, &v));
        TD_CHECK(v == 0);
        int64_t bad[2] = {2, 0};
        TD_CHECK_ERR(td_tensor_get_f64(t, bad, &v), TD_ERR_INVALID, "index 2 is out of bounds for dimension 0 with size 2");
        int64_t bad2[2] = {0, -4};
        TD_CHECK_ERR(td_tensor_set_i64(t, bad2, 1), TD_ERR_INVALID,
                     "index -4 is out of bounds for dimension 1 with size 3");
        TD_CHECK_ERR(td_tensor_get_f64(t, NULL, &v), TD_ERR_INVALID, "index is NULL for a 2-dim tensor");
        td_tensor_release(t);
    }
    td_tensor *t;
    TD_CHECK_OK(td_tensor_zeros(TD_INT8, TD_SHAPE_SCALAR, &t));
    TD_CHECK_OK(td_tensor_set_f64(t, NULL, -2.9)); /* truncates toward zero */
    int64_t i;
    TD_CHECK_OK(td_tensor_get_i64(t, NULL, &i));
    TD_CHECK_EQ(i, -2);
    TD_CHECK_OK(td_tensor_set_i64(t, NULL, 300)); /* wraps */
    TD_CHECK_OK(td_tensor_get_i64(t, NULL, &i));
    TD_CHECK_EQ(i, 44);
    td_tensor_release(t);
    TD_CHECK_OK(td_tensor_zeros(TD_INT64, TD_SHAPE(1), &t));
    int64_t z = 0;
    TD_CHECK_OK(td_tensor_set_i64(t, &z, INT64_MAX)); /* exact, not through double */
    TD_CHECK_OK(td_tensor_get_i64(t, &z, &i));
    TD_CHECK(i == INT64_MAX);
    td_tensor_release(t);
    TD_CHECK_OK(td_tensor_zeros(TD_COMPLEX128, TD_SHAPE(1), &t));
    TD_CHECK_OK(td_tensor_set_complex(t, &z, 0.25, -8));
    double v;
    TD_CHECK_OK(td_tensor_get_f64(t, &z, &v)); /* the real part */
    TD_CHECK(v == 0.25);
    td_tensor_release(t);
    TD_CHECK_OK(td_tensor_zeros(TD_BOOL, TD_SHAPE(1), &t));
    TD_CHECK_OK(td_tensor_set_complex(t, &z, 0, 1e-300));
    TD_CHECK_OK(td_tensor_get_i64(t, &z, &i));
    TD_CHECK_EQ(i, 1);
    td_tensor_release(t);
}

TD_TEST(equal_and_allclose)
{
    td_tensor *a = tensor_of(TD_FLOAT32, TD_SHAPE(2, 2), (double[]){1, 2, 3, 4});
    td_tensor *b = tensor_of(TD_FLOAT32, TD_SHAPE(2, 2), (double[]){1, 2, 3, 4});
    td_tensor *c = tensor_of(TD_FLOAT32, TD_SHAPE(2, 2), (double[]){1, 2, 3, 4.0001});
    td_tensor *d = tensor_of(TD_FLOAT64, TD_SHAPE(2, 2), (double[]){1, 2, 3, 4});
    td_tensor *e = tensor_of(TD_FLOAT32, TD_SHAPE(4), (double[]){1, 2, 3, 4});
    TD_CHECK(td_tensor_equal(a, b) && !td_tensor_equal(a, c));
    TD_CHECK(!td_tensor_equal(a, d)); /* dtypes differ */
    TD_CHECK(!td_tensor_equal(a, e)); /* shapes differ */
    TD_CHECK(td_tensor_allclose(a, c, 1e-4, 1e-8, false)); /* |diff| ~1e-4 <= 1e-8 + 1e-4 * 4 */
    TD_CHECK(!td_tensor_allclose(a, c, 1e-5, 1e-8, false));
    TD_CHECK(td_tensor_allclose(a, c, 0, 1e-3, false));
    TD_CHECK(td_tensor_allclose(a, d, 0, 0, false)); /* dtypes may differ */
    TD_CHECK(!td_tensor_allclose(a, e, 1, 1, false));

    /* Non-contiguous against contiguous. */
    td_tensor *at, *att, *ct;
    TD_CHECK_OK(td_tensor_transpose(a, 0, 1, &at));
    TD_CHECK_OK(td_tensor_contiguous(at, &ct));
    TD_CHECK(td_tensor_equal(at, ct) && !td_tensor_equal(at, a));
    TD_CHECK_OK(td_tensor_transpose(ct, 0, 1, &att));
    TD_CHECK(td_tensor_equal(att, a));

    /* NaN, infinities and signed zeros. */
    td_tensor *n1 = tensor_of(TD_FLOAT64, TD_SHAPE(3), (double[]){NAN, INFINITY, 0.0});
    td_tensor *n2 = tensor_of(TD_FLOAT64, TD_SHAPE(3), (double[]){NAN, INFINITY, -0.0});
    td_tensor *n3 = tensor_of(TD_FLOAT64, TD_SHAPE(3), (double[]){1, INFINITY, 0.0});
    td_tensor *n4 = tensor_of(TD_FLOAT64, TD_SHAPE(3), (double[]){NAN, -INFINITY, 0.0});
    TD_CHECK(!td_tensor_equal(n1, n1)); /* NaN != NaN, as torch.equal */
    TD_CHECK(!td_tensor_allclose(n1, n2, 1e-5, 1e-8, false));
    TD_CHECK(td_tensor_allclose(n1, n2, 1e-5, 1e-8, true));
    TD_CHECK(!td_tensor_allclose(n1, n3, 1e-5, 1e-8, true));
    TD_CHECK(!td_tensor_allclose(n1, n4, 1e9, 1e9, true)); /* inf is close only to the same inf */
    TD_CHECK(td_tensor_equal(n3, n3));
    td_tensor *z1 = tensor_of(TD_FLOAT16, TD_SHAPE(1), (double[]){0.0});
    td_tensor *z2 = tensor_of(TD_FLOAT16, TD_SHAPE(1), (double[]){-0.0});
    TD_CHECK(td_tensor_equal(z1, z2));

    /* Integers, bools and complex. */
    td_tensor *i1 = tensor_of(TD_INT64, TD_SHAPE(2), (double[]){5, -7});
    td_tensor *i2 = tensor_of(TD_INT64, TD_SHAPE(2), (double[]){5, -6});
    TD_CHECK(td_tensor_equal(i1, i1) && !td_tensor_equal(i1, i2) && td_tensor_allclose(i1, i2, 0, 1, false));
    td_tensor *c1, *c2;
    TD_CHECK_OK(td_tensor_zeros(TD_COMPLEX64, TD_SHAPE(1), &c1));
    TD_CHECK_OK(td_tensor_zeros(TD_COMPLEX64, TD_SHAPE(1), &c2));
    TD_CHECK_OK(td_tensor_fill_complex(c1, 1, 2));
    TD_CHECK_OK(td_tensor_fill_complex(c2, 1, 2.5));
    TD_CHECK(!td_tensor_equal(c1, c2) && td_tensor_allclose(c1, c2, 0, 0.5, false) &&
             !td_tensor_allclose(c1, c2, 0, 0.49, false));

    /* Empty tensors of one shape are equal. */
    td_tensor *e1, *e2;
    TD_CHECK_OK(td_tensor_zeros(TD_INT8, TD_SHAPE(0, 3), &e1));
    TD_CHECK_OK(td_tensor_zeros(TD_INT8, TD_SHAPE(0, 3), &e2));
    TD_CHECK(td_tensor_equal(e1, e2) && td_tensor_allclose(e1, e2, 0, 0, false));
    TD_CHECK(!td_tensor_equal(NULL, e2));

    td_tensor *all[] = {a, b, c, d, e, at, att, ct, n1, n2, n3, n4, z1, z2, i1, i2, c1, c2, e1, e2};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        td_tensor_release(all[k]);
}

TD_TEST_MAIN()
