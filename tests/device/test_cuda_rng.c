/* The per-device random number generators (spec/cuda_multigpu.md section 7): the two seed tests
 * (test_get_set_rng_state_all: restoring every device's state replays normal_ bit for bit;
 * test_rng_state_offset), the 16-byte state layout and PyTorch's default seed, the offset rules
 * (multiples of 4, advanced by every call, untouched by empty tensors), seeds, the independence
 * of devices, non-dense tensors, statistics of 1M normals and uniforms, PyTorch's messages, and
 * the Philox itself: Random123's known answers, and the values of a device call against the
 * algorithm of src/device/philox.h computed here on the host. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/device.h>
#include <tdist/testing.h>

#include "device/philox.h"
#include "device_util.h"

static const td_device cpu = {TD_DEVICE_CPU, -1};

static td_tensor *empty_on(td_device d, td_dtype dtype, td_shape shape)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_empty_on(d, dtype, shape, NULL, &t));
    return t;
}

/* A contiguous host copy (the device's work on the current stream is waited for). */
static td_tensor *host_copy(const td_tensor *t)
{
    td_tensor *h = NULL, *c = NULL;
    TD_CHECK_OK(td_tensor_to_device((td_tensor *)t, cpu, false, &h));
    TD_CHECK_OK(td_tensor_contiguous(h, &c));
    td_tensor_release(h);
    return c;
}

/* The elements of a device tensor as doubles (malloc'd, numel of them). */
static double *values_of(const td_tensor *t)
{
    td_tensor *h = host_copy(t), *d = NULL;
    TD_CHECK_OK(td_tensor_to(h, TD_FLOAT64, &d));
    int64_t n = td_tensor_numel(d);
    double *out = malloc((size_t)(n ? n : 1) * sizeof *out);
    TD_CHECK(out != NULL);
    memcpy(out, td_tensor_data(d), (size_t)n * sizeof *out);
    td_tensor_release(d);
    td_tensor_release(h);
    return out;
}

/* Bit-identical (atol=0, rtol=0 on the bytes). */
static bool same_bits(const td_tensor *a, const td_tensor *b)
{
    td_tensor *ha = host_copy(a), *hb = host_copy(b);
    bool same = td_tensor_nbytes(ha) == td_tensor_nbytes(hb) &&
                memcmp(td_tensor_data(ha), td_tensor_data(hb), td_tensor_nbytes(ha)) == 0;
    td_tensor_release(ha);
    td_tensor_release(hb);
    return same;
}

static td_tensor *normal_on(td_device d, td_dtype dtype, int64_t n)
{
    td_tensor *t = empty_on(d, dtype, TD_SHAPE(n));
    TD_CHECK_OK(td_tensor_normal_(t, 0.0, 1.0));
    return t;
}

static uint64_t state_seed(const uint8_t *s)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | s[i];
    return v;
}
static int64_t state_offset(const uint8_t *s) { return (int64_t)state_seed(s + 8); }

static int64_t offset_of(td_device d)
{
    int64_t off = -1;
    TD_CHECK_OK(td_device_rng_get_offset(d, &off));
    return off;
}

/* test_get_set_rng_state_all */
TD_TEST(test_get_set_rng_state_all, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 2);
    int n = td_device_count(type);
    uint8_t(*states)[TD_RNG_STATE_SIZE] = calloc((size_t)n, TD_RNG_STATE_SIZE);
    int count = 0;
    TD_CHECK_OK(td_device_rng_get_state_all(type, states, n, &count));
    TD_CHECK_EQ(count, n);
    td_tensor *before0 = normal_on(dev(0), TD_FLOAT32, 100);
    td_tensor *before1 = normal_on(dev(1), TD_FLOAT32, 100);
    TD_CHECK_OK(td_device_rng_set_state_all(type, (const uint8_t(*)[TD_RNG_STATE_SIZE])states, n));
    td_tensor *after0 = normal_on(dev(0), TD_FLOAT32, 100);
    td_tensor *after1 = normal_on(dev(1), TD_FLOAT32, 100);
    TD_CHECK(same_bits(before0, after0));
    TD_CHECK(same_bits(before1, after1));
    TD_CHECK_EQ(td_tensor_device(after1).index, 1);
    /* the draws are real: a second call (offset moved on) differs from the first */
    td_tensor *again0 = normal_on(dev(0), TD_FLOAT32, 100);
    TD_CHECK(!same_bits(before0, again0));
    /* too small an array for every device */
    TD_CHECK_ERR(td_device_rng_get_state_all(type, states, 1, &count), TD_ERR_INVALID, "room for 1 states");
    td_tensor_release(again0);
    td_tensor_release(after1);
    td_tensor_release(after0);
    td_tensor_release(before1);
    td_tensor_release(before0);
    free(states);
    dev_teardown();
}

/* test_rng_state_offset */
TD_TEST(test_rng_state_offset, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_device current = dev(0);
    current.index = -1;
    uint8_t before[TD_RNG_STATE_SIZE], after[TD_RNG_STATE_SIZE];
    TD_CHECK_OK(td_device_rng_get_state(current, before));
    TD_CHECK_OK(td_device_rng_set_offset(current, 100));
    int64_t offset = offset_of(current);
    TD_CHECK_OK(td_device_rng_set_state(current, before));
    TD_CHECK_EQ(offset, 100);
    TD_CHECK_OK(td_device_rng_get_state(current, after));
    TD_CHECK(memcmp(before, after, sizeof before) == 0);
    TD_CHECK_EQ(offset_of(current), state_offset(before));
    /* the offset is part of the state: it shows in the state's second 8 bytes */
    TD_CHECK_OK(td_device_rng_set_offset(dev(0), 100));
    TD_CHECK_OK(td_device_rng_get_state(dev(0), after));
    TD_CHECK_EQ(state_offset(after), 100);
    TD_CHECK_EQ(state_seed(after), state_seed(before));
    dev_teardown();
}

/* The 16-byte state: PyTorch's default seed and offset 0 at first use; every call advances the
 * offset by 4, an empty tensor by nothing; manual_seed resets the offset. */
TD_TEST(test_rng_state_layout, DEV_CASE)
{
    dev_setup(ctx, 1);
    uint8_t s[TD_RNG_STATE_SIZE];
    TD_CHECK_OK(td_device_rng_get_state(dev(0), s));
    TD_CHECK_EQ(state_seed(s), TD_RNG_DEFAULT_SEED);
    TD_CHECK_EQ(state_seed(s), UINT64_C(67280421310721));
    TD_CHECK_EQ(state_offset(s), 0);
    uint64_t seed = 0;
    TD_CHECK_OK(td_device_initial_seed(dev(0), &seed));
    TD_CHECK_EQ(seed, TD_RNG_DEFAULT_SEED);

    td_tensor *t = normal_on(dev(0), TD_FLOAT32, 1000);
    TD_CHECK_EQ(offset_of(dev(0)), PHILOX_OFFSET_PER_CALL);
    TD_CHECK_EQ(PHILOX_OFFSET_PER_CALL % 4, 0);
    TD_CHECK_OK(td_tensor_uniform_(t, -1.0, 1.0));
    TD_CHECK_EQ(offset_of(dev(0)), 2 * PHILOX_OFFSET_PER_CALL);
    td_tensor *empty = empty_on(dev(0), TD_FLOAT32, TD_SHAPE(0));
    TD_CHECK_OK(td_tensor_normal_(empty, 0.0, 1.0));
    TD_CHECK_EQ(offset_of(dev(0)), 2 * PHILOX_OFFSET_PER_CALL);

    TD_CHECK_OK(td_device_manual_seed(dev(0), 1234));
    TD_CHECK_OK(td_device_rng_get_state(dev(0), s));
    TD_CHECK_EQ(state_seed(s), 1234);
    TD_CHECK_EQ(state_offset(s), 0);
    /* a state written by hand is taken as it is */
    uint8_t hand[TD_RNG_STATE_SIZE] = {0x39, 0x30, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0, 0, 0, 0, 0}; /* 12345, 64 */
    TD_CHECK_OK(td_device_rng_set_state(dev(0), hand));
    TD_CHECK_OK(td_device_initial_seed(dev(0), &seed));
    TD_CHECK_EQ(seed, 12345);
    TD_CHECK_EQ(offset_of(dev(0)), 64);
    td_tensor_release(empty);
    td_tensor_release(t);
    dev_teardown();
}

/* Offsets must be multiples of 4 (PyTorch's set_philox_offset_per_thread), and a refused offset
 * or state changes nothing; cpu is not a device with a generator. */
TD_TEST(test_rng_offset_errors, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 2);
    TD_CHECK_OK(td_device_rng_set_offset(dev(0), 8));
    TD_CHECK_ERR(td_device_rng_set_offset(dev(0), 102), TD_ERR_INVALID, "offset must be a multiple of 4");
    TD_CHECK_EQ(offset_of(dev(0)), 8);
    TD_CHECK_ERR(td_device_rng_set_offset(dev(0), -4), TD_ERR_INVALID, "offset must be non-negative");
    TD_CHECK_EQ(offset_of(dev(0)), 8);

    uint8_t good[TD_RNG_STATE_SIZE], bad[TD_RNG_STATE_SIZE];
    TD_CHECK_OK(td_device_rng_get_state(dev(0), good));
    memcpy(bad, good, sizeof bad);
    bad[0] ^= 0x5a; /* another seed */
    bad[8] = 102;   /* offset 102 */
    TD_CHECK_ERR(td_device_rng_set_state(dev(0), bad), TD_ERR_INVALID, "offset must be a multiple of 4");
    uint8_t now[TD_RNG_STATE_SIZE];
    TD_CHECK_OK(td_device_rng_get_state(dev(0), now));
    TD_CHECK(memcmp(now, good, sizeof now) == 0);

    /* set_state_all checks every state before it sets any */
    uint8_t both[2][TD_RNG_STATE_SIZE];
    memcpy(both[0], good, TD_RNG_STATE_SIZE);
    both[0][0] ^= 1;
    memcpy(both[1], bad, TD_RNG_STATE_SIZE);
    TD_CHECK_ERR(td_device_rng_set_state_all(type, (const uint8_t(*)[TD_RNG_STATE_SIZE])both, 2), TD_ERR_INVALID,
                 "offset must be a multiple of 4");
    TD_CHECK_OK(td_device_rng_get_state(dev(0), now));
    TD_CHECK(memcmp(now, good, sizeof now) == 0);

    /* more states than devices, a device that does not exist, the cpu */
    int n = td_device_count(type);
    uint8_t(*many)[TD_RNG_STATE_SIZE] = calloc((size_t)n + 1, TD_RNG_STATE_SIZE);
    TD_CHECK_ERR(td_device_rng_set_state_all(type, (const uint8_t(*)[TD_RNG_STATE_SIZE])many, n + 1), TD_ERR_INVALID,
                 "Invalid device ordinal");
    free(many);
    td_device missing = {type, n};
    TD_CHECK_ERR(td_device_rng_get_state(missing, now), TD_ERR_INVALID, "Invalid device ordinal");
    TD_CHECK_ERR(td_device_manual_seed(cpu, 1), TD_ERR_INVALID, "device, but got: cpu");
    dev_teardown();
}

/* Seeds: the same seed gives the same numbers, another seed other numbers; manual_seed_all seeds
 * every device; devices' generators are independent of each other. */
TD_TEST(test_rng_seeds_and_devices, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 2);
    TD_CHECK_OK(td_device_manual_seed(dev(0), 42));
    td_tensor *a = normal_on(dev(0), TD_FLOAT32, 257);
    TD_CHECK_OK(td_device_manual_seed(dev(0), 42));
    td_tensor *b = normal_on(dev(0), TD_FLOAT32, 257);
    TD_CHECK_OK(td_device_manual_seed(dev(0), 43));
    td_tensor *c = normal_on(dev(0), TD_FLOAT32, 257);
    TD_CHECK(same_bits(a, b));
    TD_CHECK(!same_bits(a, c));

    /* per-device independence: drawing on device 0 moves only device 0's generator, and seeding
     * device 1 leaves device 0 alone */
    uint8_t s1[TD_RNG_STATE_SIZE], s1_after[TD_RNG_STATE_SIZE], s0[TD_RNG_STATE_SIZE], s0_after[TD_RNG_STATE_SIZE];
    TD_CHECK_OK(td_device_rng_get_state(dev(1), s1));
    TD_CHECK_OK(td_tensor_normal_(a, 0.0, 1.0));
    TD_CHECK_OK(td_device_rng_get_state(dev(1), s1_after));
    TD_CHECK(memcmp(s1, s1_after, sizeof s1) == 0);
    TD_CHECK_OK(td_device_rng_get_state(dev(0), s0));
    TD_CHECK_OK(td_device_manual_seed(dev(1), 7));
    TD_CHECK_OK(td_device_rng_get_state(dev(0), s0_after));
    TD_CHECK(memcmp(s0, s0_after, sizeof s0) == 0);

    /* same seed on two devices: the same numbers (as torch.cuda's per-device default seeds do) */
    TD_CHECK_OK(td_device_manual_seed_all(type, 99));
    td_tensor *d0 = normal_on(dev(0), TD_FLOAT32, 64);
    td_tensor *d1 = normal_on(dev(1), TD_FLOAT32, 64);
    TD_CHECK(same_bits(d0, d1));
    TD_CHECK_EQ(td_tensor_device(d1).index, 1);
    int n = td_device_count(type);
    for (int i = 0; i < n; i++)
        TD_CHECK_EQ(offset_of(dev(i)), i < 2 ? PHILOX_OFFSET_PER_CALL : 0);

    /* the stream does not matter: a replay on another stream gives the same bits */
    uint8_t st[TD_RNG_STATE_SIZE];
    TD_CHECK_OK(td_device_rng_get_state(dev(0), st));
    td_tensor *on_default = normal_on(dev(0), TD_FLOAT64, 99);
    TD_CHECK_OK(td_device_rng_set_state(dev(0), st));
    td_stream *s = NULL;
    TD_CHECK_OK(td_stream_create(dev(0), 0, &s));
    td_stream_guard g;
    TD_CHECK_OK(td_stream_guard_enter(&g, s));
    td_tensor *on_stream = normal_on(dev(0), TD_FLOAT64, 99);
    td_stream_guard_exit(&g);
    TD_CHECK_OK(td_stream_synchronize(s));
    TD_CHECK(same_bits(on_default, on_stream));
    td_stream_release(s);

    td_tensor_release(on_stream);
    td_tensor_release(on_default);
    td_tensor_release(d1);
    td_tensor_release(d0);
    td_tensor_release(c);
    td_tensor_release(b);
    td_tensor_release(a);
    TD_CHECK_OK(td_device_synchronize(dev(0)));
    TD_CHECK_OK(td_device_synchronize(dev(1)));
    dev_teardown();
}

/* Every float dtype replays bit for bit; a non-dense view gets new values only where it looks,
 * and replays too. */
TD_TEST(test_rng_dtypes_and_views, DEV_CASE)
{
    dev_setup(ctx, 1);
    static const td_dtype dtypes[] = {TD_FLOAT16, TD_BFLOAT16, TD_FLOAT32, TD_FLOAT64};
    for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++) {
        uint8_t st[TD_RNG_STATE_SIZE];
        TD_CHECK_OK(td_device_rng_get_state(dev(0), st));
        td_tensor *x = empty_on(dev(0), dtypes[k], TD_SHAPE(3, 5, 7));
        td_tensor *y = empty_on(dev(0), dtypes[k], TD_SHAPE(3, 5, 7));
        TD_CHECK_OK(td_tensor_uniform_(x, -2.0, 3.0));
        TD_CHECK_OK(td_device_rng_set_state(dev(0), st));
        TD_CHECK_OK(td_tensor_uniform_(y, -2.0, 3.0));
        TD_CHECK_MSG(same_bits(x, y), "uniform_ replay of %s", td_dtype_name(dtypes[k]));
        double *v = values_of(x);
        for (int i = 0; i < 105; i++)
            TD_CHECK_MSG(v[i] >= -2.0 && v[i] <= 3.0, "%s value %g outside [-2, 3]", td_dtype_name(dtypes[k]), v[i]);
        free(v);
        TD_CHECK_OK(td_device_rng_set_state(dev(0), st));
        TD_CHECK_OK(td_tensor_normal_(x, 1.0, 0.5));
        TD_CHECK_OK(td_device_rng_set_state(dev(0), st));
        TD_CHECK_OK(td_tensor_normal_(y, 1.0, 0.5));
        TD_CHECK_MSG(same_bits(x, y), "normal_ replay of %s", td_dtype_name(dtypes[k]));
        td_tensor_release(y);
        td_tensor_release(x);
    }

    /* a column of a 6x4 matrix (stride 4) and a transposed matrix */
    td_tensor *m = NULL;
    TD_CHECK_OK(td_tensor_full_on(dev(0), TD_FLOAT32, TD_SHAPE(6, 4), 7.0, &m));
    uint64_t version = td_tensor_version(m);
    td_tensor *col = NULL;
    TD_CHECK_OK(td_tensor_select(m, 1, 2, &col));
    uint8_t st[TD_RNG_STATE_SIZE];
    TD_CHECK_OK(td_device_rng_get_state(dev(0), st));
    TD_CHECK_OK(td_tensor_normal_(col, 0.0, 1.0));
    TD_CHECK(td_tensor_version(m) > version);
    double *v = values_of(m);
    int changed = 0;
    for (int r = 0; r < 6; r++) {
        for (int c = 0; c < 4; c++) {
            if (c != 2)
                TD_CHECK_MSG(v[r * 4 + c] == 7.0, "element (%d, %d) outside the view changed to %g", r, c,
                             v[r * 4 + c]);
            else
                changed += v[r * 4 + c] != 7.0;
        }
    }
    TD_CHECK_EQ(changed, 6);
    td_tensor *first = host_copy(col);
    TD_CHECK_OK(td_device_rng_set_state(dev(0), st));
    TD_CHECK_OK(td_tensor_normal_(col, 0.0, 1.0));
    TD_CHECK(same_bits(first, col));
    free(v);

    td_tensor *mt = NULL, *mt2 = NULL;
    TD_CHECK_OK(td_tensor_transpose(m, 0, 1, &mt));
    TD_CHECK_OK(td_device_rng_get_state(dev(0), st));
    TD_CHECK_OK(td_tensor_uniform_(mt, 10.0, 11.0));
    TD_CHECK_OK(td_device_rng_set_state(dev(0), st));
    TD_CHECK_OK(td_tensor_empty_on(dev(0), TD_FLOAT32, TD_SHAPE(4, 6), NULL, &mt2));
    TD_CHECK_OK(td_tensor_uniform_(mt2, 10.0, 11.0));
    /* a transposed matrix is dense: it is filled in memory order, so its elements are those of a
     * contiguous (6, 4) draw read transposed */
    td_tensor *mt2_host = host_copy(mt2), *m_host = host_copy(m);
    TD_CHECK(memcmp(td_tensor_data(mt2_host), td_tensor_data(m_host), 24 * sizeof(float)) == 0);
    double *tv = values_of(mt);
    for (int i = 0; i < 24; i++)
        TD_CHECK_MSG(tv[i] >= 10.0 && tv[i] <= 11.0, "transposed element %d is %g", i, tv[i]);
    free(tv);
    td_tensor_release(m_host);
    td_tensor_release(mt2_host);
    td_tensor_release(mt2);
    td_tensor_release(mt);
    td_tensor_release(first);
    td_tensor_release(col);
    td_tensor_release(m);
    TD_CHECK_OK(td_device_synchronize(dev(0)));
    dev_teardown();
}

static void moments(const double *v, int64_t n, double *mean, double *std)
{
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; i++)
        sum += v[i];
    *mean = sum / (double)n;
    for (int64_t i = 0; i < n; i++)
        sq += (v[i] - *mean) * (v[i] - *mean);
    *std = sqrt(sq / (double)(n - 1));
}

/* Statistics sanity: 1M normals and uniforms have the moments they should (loose bounds: the
 * standard error of the mean of 1M draws is std / 1000). */
TD_TEST(test_rng_statistics, DEV_CASE, .timeout_s = 120)
{
    dev_setup(ctx, 1);
    const int64_t n = 1 << 20;
    td_tensor *t = empty_on(dev(0), TD_FLOAT32, TD_SHAPE(n));
    TD_CHECK_OK(td_tensor_normal_(t, 2.0, 3.0));
    double *v = values_of(t), mean, std;
    moments(v, n, &mean, &std);
    TD_CHECK_NEAR(mean, 2.0, 0.02);
    TD_CHECK_NEAR(std, 3.0, 0.02);
    int64_t beyond3 = 0, positive = 0;
    for (int64_t i = 0; i < n; i++) {
        TD_CHECK(isfinite(v[i]));
        beyond3 += fabs(v[i] - 2.0) > 9.0;
        positive += v[i] > 2.0;
    }
    /* P(|z| > 3) = 0.27%; about half above the mean */
    TD_CHECK_MSG(beyond3 > n * 0.0020 && beyond3 < n * 0.0034, "%lld of %lld beyond 3 sigma", (long long)beyond3,
                 (long long)n);
    TD_CHECK_NEAR((double)positive / (double)n, 0.5, 0.005);
    free(v);

    TD_CHECK_OK(td_tensor_uniform_(t, -1.0, 5.0));
    v = values_of(t);
    moments(v, n, &mean, &std);
    TD_CHECK_NEAR(mean, 2.0, 0.02);
    TD_CHECK_NEAR(std, 6.0 / sqrt(12.0), 0.02);
    int64_t buckets[6] = {0};
    for (int64_t i = 0; i < n; i++) {
        TD_CHECK_MSG(v[i] >= -1.0 && v[i] <= 5.0, "uniform value %g outside [-1, 5]", v[i]);
        int b = (int)floor(v[i] + 1.0);
        buckets[b > 5 ? 5 : b]++;
    }
    for (int b = 0; b < 6; b++)
        TD_CHECK_NEAR((double)buckets[b] / (double)n, 1.0 / 6.0, 0.005);
    free(v);
    td_tensor_release(t);

    td_tensor *d = empty_on(dev(0), TD_FLOAT64, TD_SHAPE(n / 4));
    TD_CHECK_OK(td_tensor_normal_(d, -1.0, 0.5));
    v = values_of(d);
    moments(v, n / 4, &mean, &std);
    TD_CHECK_NEAR(mean, -1.0, 0.01);
    TD_CHECK_NEAR(std, 0.5, 0.01);
    free(v);
    td_tensor_release(d);

    td_tensor *h = empty_on(dev(0), TD_FLOAT16, TD_SHAPE(n / 4));
    TD_CHECK_OK(td_tensor_normal_(h, 0.0, 1.0));
    v = values_of(h);
    moments(v, n / 4, &mean, &std);
    TD_CHECK_NEAR(mean, 0.0, 0.02);
    TD_CHECK_NEAR(std, 1.0, 0.02);
    free(v);
    td_tensor_release(h);
    dev_teardown();
}

/* PyTorch's messages: std < 0, from > to, an integer tensor, a host tensor. */
TD_TEST(test_rng_errors, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_tensor *t = empty_on(dev(0), TD_FLOAT32, TD_SHAPE(4));
    TD_CHECK_ERR(td_tensor_normal_(t, 0.0, -1.0), TD_ERR_INVALID, "normal expects std >= 0.0, but found std -1");
    TD_CHECK_ERR(td_tensor_normal_(t, 0.0, NAN), TD_ERR_INVALID, "normal expects std >= 0.0, but found std");
    TD_CHECK_ERR(td_tensor_uniform_(t, 2.0, 1.0), TD_ERR_INVALID,
                 "uniform_ expects to return a [from, to) range, but found from=2 > to=1");
    td_tensor *h = empty_on(dev(0), TD_FLOAT16, TD_SHAPE(4));
    TD_CHECK_ERR(td_tensor_uniform_(h, -1e5, 1e5), TD_ERR_INVALID, "uniform_ expects to-from <= std::numeric_limits<Half>::max()");
    TD_CHECK_EQ(offset_of(dev(0)), 0); /* refused calls take nothing from the generator */
    td_tensor *l = empty_on(dev(0), TD_INT64, TD_SHAPE(4));
    char want[64];
    snprintf(want, sizeof want, "\"normal_kernel_%s\" not implemented for 'Long'", td_device_type_name(dev(0).type));
    TD_CHECK_ERR(td_tensor_normal_(l, 0.0, 1.0), TD_ERR_UNSUPPORTED, want);
    td_tensor *host = NULL;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(4), &host));
    TD_CHECK_ERR(td_tensor_normal_(host, 0.0, 1.0), TD_ERR_UNSUPPORTED, "td_tensor_normal_ needs a device tensor");
    TD_CHECK_EQ(offset_of(dev(0)), 0);
    td_tensor_release(host);
    td_tensor_release(l);
    td_tensor_release(h);
    td_tensor_release(t);
    dev_teardown();
}

/* Philox4x32-10 against Random123's known answers (kat_vectors). */
TD_TEST(test_philox_known_answers)
{
    (void)ctx;
    static const struct {
        uint32_t ctr[4], key[2], want[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t k = 0; k < sizeof kat / sizeof kat[0]; k++) {
        philox_block b = philox4x32_10(kat[k].ctr[0], kat[k].ctr[1], kat[k].ctr[2], kat[k].ctr[3], kat[k].key[0],
                                       kat[k].key[1]);
        for (int w = 0; w < 4; w++)
            TD_CHECK_MSG(b.w[w] == kat[k].want[w], "vector %zu word %d: %08x, expected %08x", k, w, b.w[w],
                         kat[k].want[w]);
    }
}

/* A device call computes what philox.h says: element i from block (seed, offset / 4, i / 4).
 * uniform_(0, 1) in float32 is exact arithmetic, so every implementation must match bit for bit;
 * normal_ goes through log, sin and cos, which may differ in the last bits between the host's and
 * the device's libraries (and with fused multiply-adds), so it is compared to a tolerance far
 * below what a wrong block or lane would give. */
TD_TEST(test_rng_matches_reference, DEV_CASE)
{
    dev_setup(ctx, 1);
    const int64_t n = 1001;
    const uint64_t seed = UINT64_C(0x0123456789abcdef);
    TD_CHECK_OK(td_device_manual_seed(dev(0), seed));
    TD_CHECK_OK(td_device_rng_set_offset(dev(0), 40));
    td_tensor *u = empty_on(dev(0), TD_FLOAT32, TD_SHAPE(n));
    TD_CHECK_OK(td_tensor_uniform_(u, 0.0, 1.0));
    td_tensor *z = empty_on(dev(0), TD_FLOAT32, TD_SHAPE(n));
    TD_CHECK_OK(td_tensor_normal_(z, 0.0, 1.0));
    td_tensor *zd = empty_on(dev(0), TD_FLOAT64, TD_SHAPE(n));
    TD_CHECK_OK(td_tensor_normal_(zd, 0.0, 1.0));
    double *uv = values_of(u), *zv = values_of(z), *zdv = values_of(zd);
    for (int64_t i = 0; i < n; i++) {
        philox_block b = philox_group_block(seed, 40, (uint64_t)i / 4);
        float want_u = (float)philox_value(b, (int)(i % 4), 0, PHILOX_DIST_UNIFORM, 0.0, 1.0);
        TD_CHECK_MSG((float)uv[i] == want_u, "uniform element %lld: %.9g, expected %.9g", (long long)i, uv[i],
                     (double)want_u);
        b = philox_group_block(seed, 40 + PHILOX_OFFSET_PER_CALL, (uint64_t)i / 4);
        float want_z = (float)philox_value(b, (int)(i % 4), 0, PHILOX_DIST_NORMAL, 0.0, 1.0);
        b = philox_group_block(seed, 40 + 2 * PHILOX_OFFSET_PER_CALL, (uint64_t)i / 2);
        double want_zd = philox_value(b, (int)(i % 2), 1, PHILOX_DIST_NORMAL, 0.0, 1.0);
        TD_CHECK_NEAR(zv[i], want_z, 1e-6 * (1.0 + fabs(want_z)));
        TD_CHECK_NEAR(zdv[i], want_zd, 1e-12 * (1.0 + fabs(want_zd)));
    }
    free(zdv);
    free(zv);
    free(uv);
    td_tensor_release(zd);
    td_tensor_release(z);
    td_tensor_release(u);
    dev_teardown();
}

TD_TEST_MAIN()
