/* Storages (heap, wrapped, weak references, in-place data swaps as the mp layer does them),
 * tensor creation and its argument checks, properties, and every view operation with the strides
 * torch gives and torch's error messages. Data movement is tested in test_copy.c. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/testing.h>

#include "tensor/storage.h"
#include "tensor_util.h"

static void check_geometry(const td_tensor *t, td_shape sizes, td_shape strides, int64_t offset)
{
    TD_CHECK_EQ(td_tensor_ndim(t), sizes.ndim);
    for (int i = 0; i < sizes.ndim; i++) {
        TD_CHECK_MSG(td_tensor_sizes(t)[i] == sizes.d[i], "size[%d] = %lld, want %lld", i,
                     (long long)td_tensor_sizes(t)[i], (long long)sizes.d[i]);
        TD_CHECK_MSG(td_tensor_strides(t)[i] == strides.d[i], "stride[%d] = %lld, want %lld", i,
                     (long long)td_tensor_strides(t)[i], (long long)strides.d[i]);
    }
    TD_CHECK_EQ(td_tensor_offset(t), offset);
}

static td_tensor *arange_view(td_dtype dt, int64_t n, td_shape shape)
{
    td_tensor *a, *v;
    TD_CHECK_OK(td_tensor_arange(dt, 0, (double)n, 1, &a));
    TD_CHECK_OK(td_tensor_view(a, shape, &v));
    td_tensor_release(a);
    return v;
}

/* ---- storages -------------------------------------------------------------------------------- */

TD_TEST(heap_storage_is_zeroed_and_aligned)
{
    td_storage *s;
    TD_CHECK_OK(td_storage_new(1000, &s));
    TD_CHECK_EQ(td_storage_nbytes(s), 1000);
    TD_CHECK(((uintptr_t)td_storage_data(s) & 63) == 0);
    for (int i = 0; i < 1000; i++)
        TD_CHECK(((unsigned char *)td_storage_data(s))[i] == 0);
    TD_CHECK(td_storage_device(s).type == TD_DEVICE_CPU);
    TD_CHECK(!td_storage_is_shared(s));
    TD_CHECK(storage_kind_of(s) == TD_STORAGE_HEAP);
    TD_CHECK(td_storage_retain(s) == s);
    TD_CHECK_EQ(storage_use_count(s), 2);
    td_storage_release(s);
    td_storage_release(s);

    TD_CHECK_OK(td_storage_new(0, &s));
    TD_CHECK(td_storage_data(s) != NULL);
    TD_CHECK_EQ(td_storage_nbytes(s), 0);
    td_storage_release(s);
    td_storage_release(NULL); /* harmless */
    TD_CHECK_ERR(td_storage_new(8, NULL), TD_ERR_INVALID, "out is NULL");
}

TD_TEST(huge_storage_fails_with_nomem)
{
#ifdef TDIST_SANITIZED
    TD_SKIP(TD_SKIP_GENERIC, "ASan aborts on huge allocations instead of returning NULL");
#else
    td_storage *s = NULL;
    TD_CHECK_ERR(td_storage_new((size_t)1 << 55, &s), TD_ERR_NOMEM,
                 "out of memory allocating a tensor storage of 32.00 PiB");
    TD_CHECK(s == NULL);
    td_tensor *t = NULL;
    TD_CHECK_ERR(td_tensor_zeros(TD_FLOAT64, TD_SHAPE((int64_t)1 << 30, (int64_t)1 << 22), &t), TD_ERR_NOMEM,
                 "out of memory allocating a tensor storage of 32.00 PiB");
#endif
}

static atomic_int freed;
static void count_free(void *ctx)
{
    TD_CHECK(ctx == &freed);
    atomic_fetch_add(&freed, 1);
}

TD_TEST(wrapped_storage_runs_its_free_once)
{
    float data[4] = {1, 2, 3, 4};
    td_storage *s;
    TD_CHECK_OK(td_storage_wrap(data, sizeof data, count_free, &freed, &s));
    TD_CHECK(td_storage_data(s) == data && td_storage_nbytes(s) == sizeof data);
    TD_CHECK(storage_kind_of(s) == TD_STORAGE_EXTERNAL && !td_storage_is_shared(s));
    td_tensor *t;
    TD_CHECK_OK(td_tensor_from_storage(s, 1, TD_FLOAT32, TD_SHAPE(3), NULL, &t));
    td_storage_release(s); /* the tensor keeps it */
    TD_CHECK_EQ(atomic_load(&freed), 0);
    TD_CHECK(value_at(t, 0) == 2 && value_at(t, 2) == 4);
    td_tensor_release(t);
    TD_CHECK_EQ(atomic_load(&freed), 1);

    TD_CHECK_OK(td_storage_wrap(NULL, 0, NULL, NULL, &s)); /* empty, no callback */
    td_storage_release(s);
    TD_CHECK_ERR(td_storage_wrap(NULL, 8, NULL, NULL, &s), TD_ERR_INVALID, "data is NULL but nbytes is 8");
}

TD_TEST(weak_references_do_not_keep_storages_alive)
{
    td_storage *s;
    TD_CHECK_OK(td_storage_new(64, &s));
    td_storage *weak = storage_weak_retain(s);
    td_storage *strong = storage_weak_lock(weak);
    TD_CHECK(strong == s);
    TD_CHECK_EQ(storage_use_count(s), 2);
    td_storage_release(strong);
    td_storage_release(s); /* data freed now; the struct lives for the weak holder */
    TD_CHECK(storage_weak_lock(weak) == NULL);
    TD_CHECK_EQ(storage_use_count(weak), 0);
    storage_weak_release(weak); /* ASan reports a leak or a double free if this is wrong */

    /* Weak references released before the last strong one. */
    TD_CHECK_OK(td_storage_new(64, &s));
    storage_weak_release(storage_weak_retain(s));
    TD_CHECK(storage_weak_lock(s) == s);
    td_storage_release(s);
    td_storage_release(s);
}

typedef struct fake_shm {
    int frees;
} fake_shm;

static void fake_shm_free(void *data, size_t nbytes, void *ctx)
{
    ((fake_shm *)ctx)->frees++;
    free(data);
}

static const td_storage_allocator fake_shm_allocator = {
    .kind = TD_STORAGE_SHM_FD, .name = "test shm", .free = fake_shm_free};

TD_TEST(swapping_storage_data_moves_every_view)
{
    td_tensor *base = arange_view(TD_FLOAT32, 12, TD_SHAPE(3, 4));
    td_tensor *col, *row;
    TD_CHECK_OK(td_tensor_select(base, 1, 1, &col)); /* [1, 5, 9] */
    TD_CHECK_OK(td_tensor_select(base, 0, 2, &row)); /* [8, 9, 10, 11] */
    td_storage *s = td_tensor_storage(base);
    size_t n = td_storage_nbytes(s);
    void *old = td_storage_data(s);

    fake_shm shm = {0};
    float *moved = malloc(n);
    TD_CHECK(moved != NULL);
    memcpy(moved, old, n);
    storage_swap_data(s, moved, n, &fake_shm_allocator, &shm, false);
    TD_CHECK(td_storage_is_shared(s) && !s->resizable);
    TD_CHECK(td_tensor_data(col) == (char *)moved + 4 && td_tensor_data(row) == (char *)moved + 32);
    moved[5] = 50; /* written through the new memory, seen by the views made before */
    TD_CHECK(value_at(col, 1) == 50 && value_at(row, 1) == 9);
    TD_CHECK_EQ(shm.frees, 0);
    td_tensor_release(base);
    td_tensor_release(col);
    TD_CHECK_EQ(shm.frees, 0);
    td_tensor_release(row);
    TD_CHECK_EQ(shm.frees, 1);
}

/* ---- creation -------------------------------------------------------------------------------- */

TD_TEST(creators_make_contiguous_tensors)
{
    td_tensor *t;
    TD_CHECK_OK(td_tensor_zeros(TD_INT16, TD_SHAPE(2, 3, 4), &t));
    check_geometry(t, TD_SHAPE(2, 3, 4), TD_SHAPE(12, 4, 1), 0);
    TD_CHECK(td_tensor_is_contiguous(t) && td_tensor_numel(t) == 24 && td_tensor_nbytes(t) == 48);
    TD_CHECK(td_tensor_dtype(t) == TD_INT16 && value_at(t, 23) == 0);
    td_tensor_release(t);

    TD_CHECK_OK(td_tensor_ones(TD_COMPLEX64, TD_SHAPE(5), &t));
    double re, im;
    int64_t i4 = 4;
    TD_CHECK_OK(td_tensor_get_complex(t, &i4, &re, &im));
    TD_CHECK(re == 1 && im == 0);
    td_tensor_release(t);

    TD_CHECK_OK(td_tensor_full(TD_BFLOAT16, TD_SHAPE(2, 2), 0.1, &t));
    TD_CHECK(value_at(t, 3) == (double)td_bfloat16_to_float(td_float_to_bfloat16(0.1f)));
    td_tensor_release(t);

    TD_CHECK_OK(td_tensor_empty(TD_FLOAT64, TD_SHAPE_SCALAR, &t));
    TD_CHECK(td_tensor_ndim(t) == 0 && td_tensor_numel(t) == 1 && td_tensor_nbytes(t) == 8);
    td_tensor_release(t);

    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(0, 5), &t));
    TD_CHECK(td_tensor_numel(t) == 0 && td_tensor_is_contiguous(t));
    check_geometry(t, TD_SHAPE(0, 5), TD_SHAPE(5, 1), 0);
    td_tensor_release(t);

    /* Size-1 and size-0 dims do not grow the strides, as in torch. */
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(2, 0, 3, 1), &t));
    check_geometry(t, TD_SHAPE(2, 0, 3, 1), TD_SHAPE(3, 3, 1, 1), 0);
    td_tensor_release(t);

    int32_t buf[6] = {1, 2, 3, 4, 5, 6};
    TD_CHECK_OK(td_tensor_from_buffer(TD_INT32, TD_SHAPE(3, 2), buf, &t));
    buf[0] = 100; /* copied, not aliased */
    TD_CHECK(value_at(t, 0) == 1 && value_at(t, 5) == 6);
    td_tensor_release(t);

    int64_t sizes[3] = {4, 5, 6};
    td_shape sh = td_shape_of(3, sizes);
    TD_CHECK(sh.ndim == 3 && sh.d[2] == 6 && td_shape_numel(&sh) == 120);
    td_shape scalar = TD_SHAPE_SCALAR;
    TD_CHECK_EQ(td_shape_numel(&scalar), 1);
}

TD_TEST(creation_rejects_bad_shapes_and_dtypes)
{
    td_tensor *t = NULL;
    TD_CHECK_ERR(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(-1, 2), &t), TD_ERR_INVALID,
                 "Trying to create tensor with negative dimension -1: [-1, 2]");
    TD_CHECK_ERR(td_tensor_empty((td_dtype)12, TD_SHAPE(2), &t), TD_ERR_INVALID, "invalid dtype 12");
    TD_CHECK_ERR(td_tensor_empty(TD_FLOAT32, TD_SHAPE((int64_t)1 << 62, 4), &t), TD_ERR_INVALID,
                 "tensor of shape [4611686018427387904, 4] and dtype float32 is too large");
    TD_CHECK_ERR(td_tensor_empty(TD_INT8, TD_SHAPE(INT64_MAX, 2), &t), TD_ERR_INVALID, "is too large");
    int64_t many[17] = {1};
    TD_CHECK_ERR(td_tensor_empty(TD_INT8, td_shape_of(17, many), &t), TD_ERR_INVALID,
                 "a tensor has 0 to 16 dims, got a shape with 17");
    TD_CHECK_ERR(td_tensor_from_buffer(TD_INT8, TD_SHAPE(3), NULL, &t), TD_ERR_INVALID, "data is NULL");
    TD_CHECK_ERR(td_tensor_zeros(TD_INT8, TD_SHAPE(3), NULL), TD_ERR_INVALID, "out is NULL");
    TD_CHECK(t == NULL);
}

TD_TEST(arange_like_torch)
{
    td_tensor *t;
    TD_CHECK_OK(td_tensor_arange(TD_INT64, 0, 10, 3, &t));
    TD_CHECK(td_tensor_numel(t) == 4 && value_at(t, 3) == 9);
    td_tensor_release(t);
    TD_CHECK_OK(td_tensor_arange(TD_FLOAT32, 1, 0, -0.25, &t));
    TD_CHECK(td_tensor_numel(t) == 4 && value_at(t, 0) == 1 && value_at(t, 3) == 0.25);
    td_tensor_release(t);
    TD_CHECK_OK(td_tensor_arange(TD_FLOAT64, 5, 5, 1, &t));
    TD_CHECK(td_tensor_numel(t) == 0);
    td_tensor_release(t);
    TD_CHECK_ERR(td_tensor_arange(TD_FLOAT32, 0, 10, 0, &t), TD_ERR_INVALID, "step must be nonzero");
    TD_CHECK_ERR(td_tensor_arange(TD_FLOAT32, 0, 10, -1, &t), TD_ERR_INVALID,
                 "upper bound and larger bound inconsistent with step sign");
    TD_CHECK_ERR(td_tensor_arange(TD_FLOAT32, 0, INFINITY, 1, &t), TD_ERR_INVALID, "unsupported range: 0 -> inf");
    TD_CHECK_ERR(td_tensor_arange(TD_FLOAT32, 0, 1e30, 1e-10, &t), TD_ERR_INVALID, "invalid size");
}

TD_TEST(from_storage_checks_bounds)
{
    td_storage *s;
    TD_CHECK_OK(td_storage_new(64, &s)); /* 16 float32 */
    td_tensor *t;
    int64_t strides[2] = {1, 4};
    TD_CHECK_OK(td_tensor_from_storage(s, 3, TD_FLOAT32, TD_SHAPE(4, 3), strides, &t)); /* last: 3+3+8 = 14 */
    check_geometry(t, TD_SHAPE(4, 3), TD_SHAPE(1, 4), 3);
    TD_CHECK(td_tensor_storage(t) == s && storage_use_count(s) == 2);
    TD_CHECK(td_tensor_data(t) == (char *)td_storage_data(s) + 12);
    td_tensor_release(t);
    TD_CHECK_OK(td_tensor_from_storage(s, 0, TD_FLOAT64, TD_SHAPE(8), NULL, &t));
    td_tensor_release(t);
    TD_CHECK_OK(td_tensor_from_storage(s, 100, TD_FLOAT32, TD_SHAPE(0), NULL, &t)); /* empty: no reach */
    td_tensor_release(t);
    TD_CHECK_ERR(td_tensor_from_storage(s, 2, TD_FLOAT32, TD_SHAPE(4, 4), NULL, &t), TD_ERR_INVALID,
                 "setStorage: sizes [4, 4], strides [4, 1], storage offset 2, and itemsize 4 requiring a storage size "
                 "of 72 are out of bounds for storage of size 64");
    int64_t neg[1] = {-1};
    TD_CHECK_ERR(td_tensor_from_storage(s, 5, TD_FLOAT32, TD_SHAPE(2), neg, &t), TD_ERR_INVALID,
                 "as_strided: Negative strides are not supported at the moment, got strides: [-1]");
    TD_CHECK_ERR(td_tensor_from_storage(s, -1, TD_FLOAT32, TD_SHAPE(2), NULL, &t), TD_ERR_INVALID,
                 "invalid storage offset -1");
    int64_t huge[2] = {INT64_MAX / 2, 1};
    TD_CHECK_ERR(td_tensor_from_storage(s, 0, TD_FLOAT32, TD_SHAPE(3, 1), huge, &t), TD_ERR_INVALID,
                 "are out of bounds for storage of size 64");
    td_storage_release(s);
}

/* ---- properties ------------------------------------------------------------------------------ */

TD_TEST(sizes_strides_and_dims)
{
    td_tensor *t = arange_view(TD_FLOAT32, 24, TD_SHAPE(2, 3, 4));
    TD_CHECK(td_tensor_size(t, 0) == 2 && td_tensor_size(t, -1) == 4 && td_tensor_size(t, -3) == 2);
    TD_CHECK(td_tensor_stride(t, 1) == 4 && td_tensor_stride(t, -1) == 1);
    TD_CHECK_EQ(td_tensor_size(t, 3), -1);
    TD_CHECK_STR_EQ(td_last_error(), "Dimension out of range (expected to be in range of [-3, 2], but got 3)");
    TD_CHECK_EQ(td_tensor_stride(t, -4), -1);
    TD_CHECK_STR_EQ(td_last_error(), "Dimension out of range (expected to be in range of [-3, 2], but got -4)");
    td_shape sh = td_tensor_shape(t);
    TD_CHECK(sh.ndim == 3 && sh.d[0] == 2 && sh.d[1] == 3 && sh.d[2] == 4);
    td_tensor_release(t);

    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE_SCALAR, &t));
    TD_CHECK(td_tensor_size(t, 0) == 1 && td_tensor_size(t, -1) == 1);
    TD_CHECK_EQ(td_tensor_size(t, 1), -1);
    TD_CHECK_STR_EQ(td_last_error(), "Dimension out of range (expected to be in range of [-1, 0], but got 1)");
    td_tensor_release(t);
}

TD_TEST(contiguity_ignores_size_one_dims)
{
    td_storage *s;
    TD_CHECK_OK(td_storage_new(256, &s));
    td_tensor *t;
    int64_t st1[3] = {4, 99, 1}; /* the size-1 dim's stride does not matter */
    TD_CHECK_OK(td_tensor_from_storage(s, 0, TD_FLOAT32, TD_SHAPE(3, 1, 4), st1, &t));
    TD_CHECK(td_tensor_is_contiguous(t));
    td_tensor_release(t);
    int64_t st2[2] = {1, 3};
    TD_CHECK_OK(td_tensor_from_storage(s, 0, TD_FLOAT32, TD_SHAPE(3, 2), st2, &t));
    TD_CHECK(!td_tensor_is_contiguous(t));
    td_tensor_release(t);
    int64_t st3[2] = {0, 7};
    TD_CHECK_OK(td_tensor_from_storage(s, 0, TD_FLOAT32, TD_SHAPE(0, 2), st3, &t));
    TD_CHECK(td_tensor_is_contiguous(t)); /* empty */
    td_tensor_release(t);
    td_storage_release(s);
}

/* ---- views ----------------------------------------------------------------------------------- */

TD_TEST(view_follows_torch_strides)
{
    td_tensor *x = arange_view(TD_FLOAT32, 6, TD_SHAPE(2, 3)), *v, *xt;
    TD_CHECK_OK(td_tensor_view(x, TD_SHAPE(3, -1), &v));
    check_geometry(v, TD_SHAPE(3, 2), TD_SHAPE(2, 1), 0);
    TD_CHECK(td_tensor_storage(v) == td_tensor_storage(x) && value_at(v, 5) == 5);
    td_tensor_release(v);
    TD_CHECK_OK(td_tensor_view(x, TD_SHAPE(1, 6, 1), &v));
    check_geometry(v, TD_SHAPE(1, 6, 1), TD_SHAPE(6, 1, 1), 0);
    td_tensor_release(v);

    TD_CHECK_OK(td_tensor_transpose(x, 0, 1, &xt)); /* [3, 2] strides [1, 3] */
    TD_CHECK_ERR(td_tensor_view(xt, TD_SHAPE(6), &v), TD_ERR_INVALID,
                 "view size is not compatible with input tensor's size and stride (at least one dimension spans "
                 "across two contiguous subspaces). Use .reshape(...) instead.");
    TD_CHECK_OK(td_tensor_view(xt, TD_SHAPE(1, 3, 2), &v)); /* splitting off size-1 dims is fine */
    check_geometry(v, TD_SHAPE(1, 3, 2), TD_SHAPE(3, 1, 3), 0);
    td_tensor_release(v);
    TD_CHECK_ERR(td_tensor_view(x, TD_SHAPE(4, -1), &v), TD_ERR_INVALID, "shape '[4, -1]' is invalid for input of size 6");
    TD_CHECK_ERR(td_tensor_view(x, TD_SHAPE(-1, -1), &v), TD_ERR_INVALID, "only one dimension can be inferred");
    TD_CHECK_ERR(td_tensor_view(x, TD_SHAPE(2, -2), &v), TD_ERR_INVALID, "invalid shape dimension -2");
    TD_CHECK_ERR(td_tensor_view(x, TD_SHAPE(7), &v), TD_ERR_INVALID, "shape '[7]' is invalid for input of size 6");

    /* A column of a bigger matrix: [4, 1] strides... viewing rows of a narrowed matrix. */
    td_tensor *big = arange_view(TD_FLOAT32, 24, TD_SHAPE(4, 6)), *nar;
    TD_CHECK_OK(td_tensor_narrow(big, 1, 2, 4, &nar)); /* [4, 4] strides [6, 1] offset 2 */
    TD_CHECK_OK(td_tensor_view(nar, TD_SHAPE(4, 2, 2), &v));
    check_geometry(v, TD_SHAPE(4, 2, 2), TD_SHAPE(6, 2, 1), 2);
    TD_CHECK(value_at(v, 4) == 8);
    td_tensor_release(v);
    TD_CHECK_ERR(td_tensor_view(nar, TD_SHAPE(16), &v), TD_ERR_INVALID, "Use .reshape(...) instead.");

    td_tensor *e, *ev;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(0, 3), &e));
    TD_CHECK_OK(td_tensor_view(e, TD_SHAPE(3, 0), &ev));
    check_geometry(ev, TD_SHAPE(3, 0), TD_SHAPE(1, 1), 0);
    td_tensor_release(ev);
    TD_CHECK_ERR(td_tensor_view(e, TD_SHAPE(-1, 0), &ev), TD_ERR_INVALID,
                 "cannot reshape tensor of 0 elements into shape [-1, 0] because the unspecified dimension size -1 can "
                 "be any value and is ambiguous");
    td_tensor *sc, *sv;
    TD_CHECK_OK(td_tensor_full(TD_INT32, TD_SHAPE_SCALAR, 7, &sc));
    TD_CHECK_OK(td_tensor_view(sc, TD_SHAPE(1, 1), &sv));
    check_geometry(sv, TD_SHAPE(1, 1), TD_SHAPE(1, 1), 0);
    td_tensor_release(sv);
    TD_CHECK_OK(td_tensor_view(sv = td_tensor_retain(sc), TD_SHAPE_SCALAR, &ev));
    td_tensor_release(sv);
    td_tensor_release(ev);
    td_tensor_release(sc);
    td_tensor_release(e);
    td_tensor_release(big);
    td_tensor_release(nar);
    td_tensor_release(xt);
    td_tensor_release(x);
}

TD_TEST(reshape_views_when_it_can_and_copies_otherwise)
{
    td_tensor *x = arange_view(TD_INT64, 6, TD_SHAPE(2, 3)), *r, *xt;
    TD_CHECK_OK(td_tensor_reshape(x, TD_SHAPE(3, 2), &r));
    TD_CHECK(td_tensor_storage(r) == td_tensor_storage(x));
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_transpose(x, 0, 1, &xt));
    TD_CHECK_OK(td_tensor_reshape(xt, TD_SHAPE(3, 2), &r)); /* the same shape: a view, as in torch */
    TD_CHECK(td_tensor_storage(r) == td_tensor_storage(x) && !td_tensor_is_contiguous(r));
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_reshape(xt, TD_SHAPE(2, 3), &r)); /* [[0,3,1],[4,2,5]]: needs a copy */
    TD_CHECK(td_tensor_storage(r) != td_tensor_storage(x) && td_tensor_is_contiguous(r));
    static const double want[6] = {0, 3, 1, 4, 2, 5};
    for (int i = 0; i < 6; i++)
        TD_CHECK(value_at(r, i) == want[i]);
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_flatten(xt, &r));
    check_geometry(r, TD_SHAPE(6), TD_SHAPE(1), 0);
    TD_CHECK(value_at(r, 1) == 3);
    td_tensor_release(r);
    TD_CHECK_OK(td_tensor_flatten(x, &r)); /* contiguous: a view */
    TD_CHECK(td_tensor_storage(r) == td_tensor_storage(x));
    td_tensor_release(r);
    td_tensor *s, *f;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT32, TD_SHAPE_SCALAR, 2, &s));
    TD_CHECK_OK(td_tensor_flatten(s, &f));
    check_geometry(f, TD_SHAPE(1), TD_SHAPE(1), 0);
    td_tensor_release(f);
    td_tensor_release(s);
    TD_CHECK_ERR(td_tensor_reshape(x, TD_SHAPE(4), &r), TD_ERR_INVALID, "shape '[4]' is invalid for input of size 6");
    td_tensor_release(xt);
    td_tensor_release(x);
}

TD_TEST(narrow_and_select)
{
    td_tensor *x = arange_view(TD_FLOAT32, 12, TD_SHAPE(3, 4)), *v;
    TD_CHECK_OK(td_tensor_narrow(x, 1, 1, 2, &v));
    check_geometry(v, TD_SHAPE(3, 2), TD_SHAPE(4, 1), 1);
    TD_CHECK(value_at(v, 2) == 5);
    td_tensor_release(v);
    TD_CHECK_OK(td_tensor_narrow(x, 0, -2, 2, &v)); /* negative start counts from the end */
    check_geometry(v, TD_SHAPE(2, 4), TD_SHAPE(4, 1), 4);
    td_tensor_release(v);
    TD_CHECK_OK(td_tensor_narrow(x, -1, 4, 0, &v));
    check_geometry(v, TD_SHAPE(3, 0), TD_SHAPE(4, 1), 4);
    td_tensor_release(v);
    TD_CHECK_ERR(td_tensor_narrow(x, 1, 2, 3, &v), TD_ERR_INVALID, "start (2) + length (3) exceeds dimension size (4).");
    TD_CHECK_ERR(td_tensor_narrow(x, 1, -5, 1, &v), TD_ERR_INVALID,
                 "start out of range (expected to be in range of [-4, 4], but got -5)");
    TD_CHECK_ERR(td_tensor_narrow(x, 1, 0, -1, &v), TD_ERR_INVALID, "narrow(): length must be non-negative.");
    TD_CHECK_ERR(td_tensor_narrow(x, 2, 0, 1, &v), TD_ERR_INVALID,
                 "Dimension out of range (expected to be in range of [-2, 1], but got 2)");

    TD_CHECK_OK(td_tensor_select(x, 1, -1, &v)); /* column 3 */
    check_geometry(v, TD_SHAPE(3), TD_SHAPE(4), 3);
    TD_CHECK(value_at(v, 2) == 11);
    td_tensor *s;
    TD_CHECK_OK(td_tensor_select(v, 0, 1, &s)); /* 0-dim */
    TD_CHECK(td_tensor_ndim(s) == 0 && td_tensor_offset(s) == 7);
    TD_CHECK_ERR(td_tensor_select(s, 0, 0, &v), TD_ERR_INVALID, "select() cannot be applied to a 0-dim tensor.");
    TD_CHECK_ERR(td_tensor_narrow(s, 0, 0, 1, &v), TD_ERR_INVALID, "narrow() cannot be applied to a 0-dim tensor.");
    td_tensor_release(s);
    td_tensor_release(v);
    TD_CHECK_ERR(td_tensor_select(x, 1, 4, &v), TD_ERR_INVALID,
                 "select(): index 4 out of range for tensor of size [3, 4] at dimension 1");
    TD_CHECK_ERR(td_tensor_select(x, 0, -4, &v), TD_ERR_INVALID,
                 "select(): index -4 out of range for tensor of size [3, 4] at dimension 0");
    TD_CHECK_ERR(td_tensor_select(x, -3, 0, &v), TD_ERR_INVALID,
                 "Dimension out of range (expected to be in range of [-2, 1], but got -3)");
    td_tensor_release(x);
}

TD_TEST(transpose_and_permute)
{
    td_tensor *x = arange_view(TD_FLOAT32, 24, TD_SHAPE(2, 3, 4)), *v;
    TD_CHECK_OK(td_tensor_transpose(x, 0, -1, &v));
    check_geometry(v, TD_SHAPE(4, 3, 2), TD_SHAPE(1, 4, 12), 0);
    TD_CHECK(!td_tensor_is_contiguous(v) && value_at(v, 1) == 12);
    td_tensor_release(v);
    TD_CHECK_OK(td_tensor_transpose(x, 1, 1, &v));
    check_geometry(v, TD_SHAPE(2, 3, 4), TD_SHAPE(12, 4, 1), 0);
    td_tensor_release(v);
    TD_CHECK_ERR(td_tensor_transpose(x, 0, 3, &v), TD_ERR_INVALID,
                 "Dimension out of range (expected to be in range of [-3, 2], but got 3)");
    int p[3] = {2, 0, 1};
    TD_CHECK_OK(td_tensor_permute(x, p, 3, &v));
    check_geometry(v, TD_SHAPE(4, 2, 3), TD_SHAPE(1, 12, 4), 0);
    td_tensor_release(v);
    int neg[3] = {-1, -3, -2};
    TD_CHECK_OK(td_tensor_permute(x, neg, 3, &v));
    check_geometry(v, TD_SHAPE(4, 2, 3), TD_SHAPE(1, 12, 4), 0);
    td_tensor_release(v);
    int dup[3] = {0, 0, 1};
    TD_CHECK_ERR(td_tensor_permute(x, dup, 3, &v), TD_ERR_INVALID, "permute(): duplicate dims are not allowed.");
    TD_CHECK_ERR(td_tensor_permute(x, p, 2, &v), TD_ERR_INVALID,
                 "number of dimensions in the tensor input does not match the length of the desired ordering of "
                 "dimensions i.e. input.dim() = 3 is not equal to len(dims) = 2");
    int bad[3] = {0, 1, 3};
    TD_CHECK_ERR(td_tensor_permute(x, bad, 3, &v), TD_ERR_INVALID, "Dimension out of range");
    td_tensor *s, *sv;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE_SCALAR, &s));
    TD_CHECK_OK(td_tensor_permute(s, NULL, 0, &sv));
    TD_CHECK_EQ(td_tensor_ndim(sv), 0);
    td_tensor_release(sv);
    TD_CHECK_OK(td_tensor_transpose(s, 0, -1, &sv));
    td_tensor_release(sv);
    td_tensor_release(s);
    td_tensor_release(x);
}

TD_TEST(expand_uses_zero_strides)
{
    td_tensor *x = arange_view(TD_FLOAT32, 3, TD_SHAPE(3, 1)), *v;
    TD_CHECK_OK(td_tensor_expand(x, TD_SHAPE(2, 3, 4), &v));
    check_geometry(v, TD_SHAPE(2, 3, 4), TD_SHAPE(0, 1, 0), 0);
    TD_CHECK(value_at(v, 23) == 2 && !td_tensor_is_contiguous(v));
    td_tensor_release(v);
    TD_CHECK_OK(td_tensor_expand(x, TD_SHAPE(1, -1, 1), &v)); /* -1 keeps; a new size-1 dim */
    check_geometry(v, TD_SHAPE(1, 3, 1), TD_SHAPE(3, 1, 1), 0);
    td_tensor_release(v);
    td_tensor *m = arange_view(TD_FLOAT32, 6, TD_SHAPE(2, 3));
    TD_CHECK_OK(td_tensor_expand(m, TD_SHAPE(4, 2, 3), &v));
    check_geometry(v, TD_SHAPE(4, 2, 3), TD_SHAPE(0, 3, 1), 0);
    td_tensor_release(v);
    TD_CHECK_ERR(td_tensor_expand(m, TD_SHAPE(4), &v), TD_ERR_INVALID,
                 "the number of sizes provided (1) must be greater or equal to the number of dimensions in the tensor "
                 "(2)");
    TD_CHECK_ERR(td_tensor_expand(m, TD_SHAPE(2, 4), &v), TD_ERR_INVALID,
                 "The expanded size of the tensor (4) must match the existing size (3) at non-singleton dimension 1.  "
                 "Target sizes: [2, 4].  Tensor sizes: [2, 3]");
    TD_CHECK_ERR(td_tensor_expand(m, TD_SHAPE(-1, 2, 3), &v), TD_ERR_INVALID,
                 "The expanded size of the tensor (-1) isn't allowed in a leading, non-existing dimension 0");
    td_tensor_release(m);
    td_tensor_release(x);
}

TD_TEST(unsqueeze_and_squeeze)
{
    td_tensor *x = arange_view(TD_FLOAT32, 6, TD_SHAPE(2, 3)), *xt, *v, *w;
    TD_CHECK_OK(td_tensor_unsqueeze(x, 2, &v));
    check_geometry(v, TD_SHAPE(2, 3, 1), TD_SHAPE(3, 1, 1), 0);
    td_tensor_release(v);
    TD_CHECK_OK(td_tensor_unsqueeze(x, 1, &v));
    check_geometry(v, TD_SHAPE(2, 1, 3), TD_SHAPE(3, 3, 1), 0);
    TD_CHECK_OK(td_tensor_squeeze(v, 1, &w));
    check_geometry(w, TD_SHAPE(2, 3), TD_SHAPE(3, 1), 0);
    td_tensor_release(w);
    TD_CHECK_OK(td_tensor_squeeze(v, 0, &w)); /* size 2: unchanged */
    check_geometry(w, TD_SHAPE(2, 1, 3), TD_SHAPE(3, 3, 1), 0);
    td_tensor_release(w);
    td_tensor_release(v);
    TD_CHECK_OK(td_tensor_transpose(x, 0, 1, &xt));
    TD_CHECK_OK(td_tensor_unsqueeze(xt, 0, &v)); /* torch: (3, 1, 3) */
    check_geometry(v, TD_SHAPE(1, 3, 2), TD_SHAPE(3, 1, 3), 0);
    td_tensor_release(v);
    TD_CHECK_OK(td_tensor_unsqueeze(x, -1, &v));
    check_geometry(v, TD_SHAPE(2, 3, 1), TD_SHAPE(3, 1, 1), 0);
    td_tensor_release(v);
    TD_CHECK_ERR(td_tensor_unsqueeze(x, 3, &v), TD_ERR_INVALID,
                 "Dimension out of range (expected to be in range of [-3, 2], but got 3)");
    TD_CHECK_ERR(td_tensor_squeeze(x, -3, &v), TD_ERR_INVALID,
                 "Dimension out of range (expected to be in range of [-2, 1], but got -3)");
    td_tensor *s;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE_SCALAR, &s));
    TD_CHECK_OK(td_tensor_unsqueeze(s, 0, &v));
    check_geometry(v, TD_SHAPE(1), TD_SHAPE(1), 0);
    TD_CHECK_OK(td_tensor_squeeze(v, 0, &w));
    TD_CHECK_EQ(td_tensor_ndim(w), 0);
    td_tensor_release(w);
    td_tensor_release(v);
    TD_CHECK_OK(td_tensor_squeeze(s, -1, &v));
    TD_CHECK_EQ(td_tensor_ndim(v), 0);
    td_tensor_release(v);
    td_tensor_release(s);
    int64_t ones[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    TD_CHECK_OK(td_tensor_zeros(TD_INT8, td_shape_of(16, ones), &s));
    TD_CHECK_ERR(td_tensor_unsqueeze(s, 0, &v), TD_ERR_INVALID, "at most 16 dims");
    td_tensor_release(s);
    td_tensor_release(xt);
    td_tensor_release(x);
}

TD_TEST(contiguous_clone_and_to)
{
    td_tensor *x = arange_view(TD_FLOAT32, 6, TD_SHAPE(2, 3)), *c, *xt;
    TD_CHECK_OK(td_tensor_contiguous(x, &c));
    TD_CHECK(c == x); /* the same handle, retained */
    td_tensor_release(c);
    TD_CHECK_OK(td_tensor_transpose(x, 0, 1, &xt));
    TD_CHECK_OK(td_tensor_contiguous(xt, &c));
    TD_CHECK(c != xt && td_tensor_is_contiguous(c) && td_tensor_storage(c) != td_tensor_storage(x));
    TD_CHECK(value_at(c, 1) == 3 && value_at(c, 4) == 2);
    td_tensor_release(c);
    TD_CHECK_OK(td_tensor_clone(x, &c));
    TD_CHECK(td_tensor_storage(c) != td_tensor_storage(x) && td_tensor_equal(c, x));
    td_tensor_release(c);
    TD_CHECK_OK(td_tensor_to(xt, TD_INT16, &c));
    TD_CHECK(td_tensor_dtype(c) == TD_INT16 && td_tensor_is_contiguous(c) && value_at(c, 1) == 3);
    td_tensor_release(c);
    TD_CHECK_ERR(td_tensor_to(x, (td_dtype)-3, &c), TD_ERR_INVALID, "invalid dtype -3");
    TD_CHECK_ERR(td_tensor_clone(NULL, &c), TD_ERR_INVALID, "tensor is NULL");
    td_tensor_release(xt);
    td_tensor_release(x);
}

TD_TEST(views_keep_the_storage_alive)
{
    td_tensor *x = arange_view(TD_INT32, 10, TD_SHAPE(10)), *v;
    TD_CHECK_OK(td_tensor_narrow(x, 0, 5, 5, &v));
    td_storage *s = td_tensor_storage(x);
    TD_CHECK_EQ(storage_use_count(s), 2);
    td_tensor_release(x);
    TD_CHECK_EQ(storage_use_count(s), 1);
    TD_CHECK(value_at(v, 4) == 9);
    TD_CHECK(td_tensor_retain(v) == v);
    td_tensor_release(v);
    td_tensor_release(v);
    td_tensor_release(NULL);
}

TD_TEST_MAIN()
