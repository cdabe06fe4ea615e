/* Direct tests of the CUDA implementation of the device interface (device_cuda_impl, cuda.c),
 * below the runtime front end: raw memory and mem_get_info, copies, the embedded kernels (fill,
 * strided copy, add, sleep), stream queries, events and their timing, priorities. Every case but
 * the first runs on instance "cuda" (CTest label gpu) and skips without a GPU; the first checks
 * that a machine without a driver or GPU sees zero devices and clean errors. Each case ends with
 * shutdown(), which releases the primary contexts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/testing.h>

#include "device/device_impl.h"
#include "device_util.h"


#define CUDA_IMPL device_cuda_impl
#define MIB ((size_t)1 << 20)
#define FIFTY_MIL_CYCLES 50000000LL

static void need_cuda(int devices)
{
    int have = CUDA_IMPL.count();
    if (have == 0)
        TD_SKIP(TD_SKIP_NO_CUDA, "CUDA is not available.");
    if (have < devices)
        TD_SKIP(td_skip_multi_gpu(devices), "Need more CUDA devices");
}

/* A kernel case needs a GPU, and a build without nvcc has no kernels: their cases check the error
 * and skip. Otherwise the first launch loads the embedded fatbin, and must work. */
static void need_kernels(void)
{
    need_cuda(1);
    td_status s = CUDA_IMPL.sleep(0, 1, NULL);
    if (s == TD_ERR_UNSUPPORTED) {
        TD_CHECK_CONTAINS(td_last_error(), "tdist was built without nvcc: CUDA kernels are not available");
        TD_SKIP(TD_SKIP_GENERIC, "tdist was built without nvcc: CUDA kernels are not available");
    }
    TD_CHECK_OK(s);
    TD_CHECK_OK(CUDA_IMPL.stream_synchronize(0, NULL));
}

#define CUDA_CASE .params = "cuda", .setup = dev_process_setup, .timeout_s = 120

static void *dev_alloc(size_t nbytes)
{
    void *p = NULL;
    TD_CHECK_OK(CUDA_IMPL.device_malloc(0, nbytes, &p));
    TD_CHECK(p != NULL);
    return p;
}

static void to_device(void *dst, const void *src, size_t nbytes)
{
    TD_CHECK_OK(CUDA_IMPL.memcpy_async(0, dst, src, nbytes, DEVICE_COPY_H2D, NULL));
    TD_CHECK_OK(CUDA_IMPL.stream_synchronize(0, NULL));
}

static void to_host(void *dst, const void *src, size_t nbytes)
{
    TD_CHECK_OK(CUDA_IMPL.memcpy_async(0, dst, src, nbytes, DEVICE_COPY_D2H, NULL));
    TD_CHECK_OK(CUDA_IMPL.stream_synchronize(0, NULL));
}

/* IEEE half <-> float for normal values (round to nearest even), for checking the float16 add. */
static uint16_t float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffffu;
    if ((x & 0x7fffffffu) == 0)
        return (uint16_t)sign;
    TD_CHECK_MSG(exp > 0 && exp < 31, "float_to_half: %g is outside the normal half range", (double)f);
    uint32_t half = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u)))
        half++;
    return (uint16_t)half;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t x;
    if (exp == 0 && mant == 0)
        x = sign;
    else {
        TD_CHECK_MSG(exp != 0 && exp != 31, "half_to_float: 0x%04x is not a normal half", h);
        x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* bfloat16: the upper half of a float, rounded to nearest even (finite values). */
static uint16_t float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static float bf16_to_float(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* ---- no driver, no GPU: zero devices, clean errors ------------------------------------------- */

TD_TEST(cuda_count_never_fails, .setup = dev_process_setup)
{
    int n = CUDA_IMPL.count();
    TD_CHECK(n >= 0);
    TD_CHECK_EQ(CUDA_IMPL.count(), n);
    TD_CHECK_STR_EQ(CUDA_IMPL.name, "cuda");
    TD_CHECK_EQ(CUDA_IMPL.type, TD_DEVICE_CUDA);
    size_t free_b = 0, total_b = 0;
    if (n == 0) {
        TD_CHECK_ERR(CUDA_IMPL.mem_get_info(0, &free_b, &total_b), TD_ERR_UNSUPPORTED, "CUDA is not available");
        void *p = NULL;
        TD_CHECK_ERR(CUDA_IMPL.device_malloc(0, 16, &p), TD_ERR_UNSUPPORTED, "CUDA is not available");
        TD_CHECK(p == NULL);
        TD_CHECK_ERR(CUDA_IMPL.host_malloc(16, &p), TD_ERR_UNSUPPORTED, "CUDA is not available");
        TD_CHECK_ERR(CUDA_IMPL.sleep(0, 10, NULL), TD_ERR_UNSUPPORTED, NULL);
        td_device_properties props;
        TD_CHECK_ERR(CUDA_IMPL.properties(0, &props), TD_ERR_UNSUPPORTED, NULL);
    } else {
        TD_CHECK_ERR(CUDA_IMPL.mem_get_info(n, &free_b, &total_b), TD_ERR_INVALID, "Invalid device ordinal");
    }
    CUDA_IMPL.shutdown();
}

/* ---- devices and memory ------------------------------------------------------------------------ */

TD_TEST(cuda_properties, CUDA_CASE)
{
    need_cuda(1);
    td_device_properties props;
    TD_CHECK_OK(CUDA_IMPL.properties(0, &props));
    TD_CHECK(props.name[0] != '\0');
    TD_CHECK(props.total_memory > 0);
    TD_CHECK(props.major >= 3);
    TD_CHECK(props.multi_processor_count > 0);
    TD_CHECK(props.clock_rate_khz > 0);
    size_t free_b = 0, total_b = 0;
    TD_CHECK_OK(CUDA_IMPL.mem_get_info(0, &free_b, &total_b));
    TD_CHECK(total_b > 0 && free_b <= total_b);
    TD_CHECK(total_b <= props.total_memory);
    TD_CHECK_OK(CUDA_IMPL.device_synchronize(0));
    CUDA_IMPL.shutdown();
}

TD_TEST(cuda_malloc_and_mem_get_info, CUDA_CASE)
{
    need_cuda(1);
    size_t free0 = 0, total0 = 0, free1 = 0, total1 = 0;
    TD_CHECK_OK(CUDA_IMPL.mem_get_info(0, &free0, &total0));
    void *p = dev_alloc(32 * MIB);
    TD_CHECK_OK(CUDA_IMPL.mem_get_info(0, &free1, &total1));
    TD_CHECK_EQ(total1, total0);
    TD_CHECK_MSG(free1 <= free0 && free0 - free1 >= 32 * MIB,
                 "free memory went from %zu to %zu bytes for a 32 MiB allocation", free0, free1);
    CUDA_IMPL.device_free(0, p);

    void *none = (void *)1;
    TD_CHECK_OK(CUDA_IMPL.device_malloc(0, 0, &none));
    TD_CHECK(none == NULL);
    CUDA_IMPL.device_free(0, NULL);

    /* More than the device has: TD_ERR_NOMEM with PyTorch's words. */
    void *huge = NULL;
    TD_CHECK_ERR(CUDA_IMPL.device_malloc(0, total0 + ((size_t)1 << 30), &huge), TD_ERR_NOMEM,
                 "CUDA out of memory. Tried to allocate ");
    TD_CHECK_CONTAINS(td_last_error(), "GPU 0 has a total capacity of ");
    TD_CHECK(huge == NULL);
    CUDA_IMPL.shutdown();
}

TD_TEST(cuda_memcpy_round_trip, CUDA_CASE)
{
    need_cuda(1);
    const size_t n = 4 * MIB + 3;
    unsigned char *src = malloc(n), *back = malloc(n);
    TD_CHECK(src && back);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(i * 131u + 7u);
    unsigned char *d = dev_alloc(n);
    unsigned char *d2 = dev_alloc(n);

    /* Pageable host memory on the default stream. */
    memset(back, 0, n);
    to_device(d, src, n);
    to_host(back, d, n);
    TD_CHECK(memcmp(src, back, n) == 0);

    /* Pinned memory, a device-to-device hop, on a created stream. */
    void *stream = NULL;
    TD_CHECK_OK(CUDA_IMPL.stream_create(0, 0, &stream));
    unsigned char *pinned = NULL;
    TD_CHECK_OK(CUDA_IMPL.host_malloc(n, (void **)&pinned));
    TD_CHECK(pinned != NULL);
    memset(pinned, 0, n);
    TD_CHECK_OK(CUDA_IMPL.memcpy_async(0, d2, d, n, DEVICE_COPY_D2D, stream));
    TD_CHECK_OK(CUDA_IMPL.memcpy_async(0, pinned, d2, n, DEVICE_COPY_D2H, stream));
    TD_CHECK_OK(CUDA_IMPL.stream_synchronize(0, stream));
    TD_CHECK_EQ(CUDA_IMPL.stream_query(0, stream), 1);
    TD_CHECK(memcmp(src, pinned, n) == 0);
    TD_CHECK_OK(CUDA_IMPL.memcpy_async(0, d, d, 0, DEVICE_COPY_D2D, stream)); /* zero bytes: nothing */

    CUDA_IMPL.host_free(pinned);
    CUDA_IMPL.host_free(NULL);
    CUDA_IMPL.stream_destroy(0, stream);
    CUDA_IMPL.device_free(0, d);
    CUDA_IMPL.device_free(0, d2);
    free(src);
    free(back);
    CUDA_IMPL.shutdown();
}

TD_TEST(cuda_memcpy_peer, CUDA_CASE)
{
    need_cuda(2);
    const size_t n = MIB + 5;
    unsigned char *src = malloc(n), *back = calloc(1, n);
    TD_CHECK(src && back);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(i * 7u + 1u);
    void *d0 = dev_alloc(n), *d1 = NULL;
    TD_CHECK_OK(CUDA_IMPL.device_malloc(1, n, &d1));
    to_device(d0, src, n);
    TD_CHECK_OK(CUDA_IMPL.memcpy_peer_async(1, d1, 0, d0, n, NULL));
    TD_CHECK_OK(CUDA_IMPL.stream_synchronize(0, NULL));
    TD_CHECK_OK(CUDA_IMPL.memcpy_async(1, back, d1, n, DEVICE_COPY_D2H, NULL));
    TD_CHECK_OK(CUDA_IMPL.stream_synchronize(1, NULL));
    TD_CHECK(memcmp(src, back, n) == 0);
    CUDA_IMPL.device_free(1, d1);
    CUDA_IMPL.device_free(0, d0);
    free(src);
    free(back);
    CUDA_IMPL.shutdown();
}

/* ---- kernels ----------------------------------------------------------------------------------- */

TD_TEST(cuda_fill, CUDA_CASE)
{
    need_kernels();
    enum { N = 1000 };
    /* 4-byte elements: 1.0f everywhere. */
    float *df = dev_alloc(N * sizeof(float));
    float one = 1.0f;
    TD_CHECK_OK(CUDA_IMPL.fill(0, df, N, &one, sizeof one, NULL));
    float hf[N];
    to_host(hf, df, sizeof hf);
    for (int i = 0; i < N; i++)
        TD_CHECK_MSG(hf[i] == 1.0f, "float fill: element %d is %g", i, (double)hf[i]);

    /* 8-byte elements (the kernel): 2.5 in [1, N-1), zeros around it. */
    double *dd = dev_alloc(N * sizeof(double));
    uint64_t zero = 0;
    TD_CHECK_OK(CUDA_IMPL.fill(0, dd, N, &zero, sizeof zero, NULL));
    double v = 2.5;
    TD_CHECK_OK(CUDA_IMPL.fill(0, dd + 1, N - 2, &v, sizeof v, NULL));
    double hd[N];
    to_host(hd, dd, sizeof hd);
    for (int i = 0; i < N; i++) {
        double want = (i == 0 || i == N - 1) ? 0.0 : 2.5;
        TD_CHECK_MSG(hd[i] == want, "double fill: element %d is %g, want %g", i, hd[i], want);
    }

    /* 16-byte (complex128) and 2-byte elements, a 4-byte fill at an offset of 4 bytes; an odd
     * address for 4-byte elements is refused (a misaligned kernel access would ruin the context). */
    double *dc = dev_alloc(N * 2 * sizeof(double));
    double c[2] = {1.5, -3.0};
    TD_CHECK_OK(CUDA_IMPL.fill(0, dc, N, c, sizeof c, NULL));
    static double hc[N * 2];
    to_host(hc, dc, sizeof hc);
    for (int i = 0; i < N; i++)
        TD_CHECK_MSG(hc[2 * i] == 1.5 && hc[2 * i + 1] == -3.0, "complex fill: element %d is (%g, %g)", i,
                     hc[2 * i], hc[2 * i + 1]);
    unsigned char *db = dev_alloc(4 * N + 4);
    unsigned char byte = 0xee;
    TD_CHECK_OK(CUDA_IMPL.fill(0, db, 4 * N + 4, &byte, 1, NULL));
    uint32_t pattern = 0x11223344u;
    TD_CHECK_OK(CUDA_IMPL.fill(0, db + 4, N, &pattern, 4, NULL));
    TD_CHECK_ERR(CUDA_IMPL.fill(0, db + 1, N, &pattern, 4, NULL), TD_ERR_INVALID, "not aligned");
    TD_CHECK_ERR(CUDA_IMPL.fill(0, db + 4, N, &v, 8, NULL), TD_ERR_INVALID, "not aligned");
    uint16_t h2 = 0xabcd;
    TD_CHECK_OK(CUDA_IMPL.fill(0, dd, 3, &h2, 2, NULL));
    static unsigned char hb[4 * N + 4];
    to_host(hb, db, sizeof hb);
    TD_CHECK(hb[0] == 0xee && hb[3] == 0xee);
    for (int i = 0; i < N; i++) {
        uint32_t got;
        memcpy(&got, hb + 4 + 4 * i, 4);
        TD_CHECK_MSG(got == pattern, "offset fill: element %d is 0x%08x", i, got);
    }
    uint16_t hs[4];
    to_host(hs, dd, sizeof hs);
    TD_CHECK(hs[0] == 0xabcd && hs[1] == 0xabcd && hs[2] == 0xabcd);
    TD_CHECK_ERR(CUDA_IMPL.fill(0, dd, 1, &v, 3, NULL), TD_ERR_INVALID, "element size");

    CUDA_IMPL.device_free(0, df);
    CUDA_IMPL.device_free(0, dd);
    CUDA_IMPL.device_free(0, dc);
    CUDA_IMPL.device_free(0, db);
    CUDA_IMPL.shutdown();
}

/* A rows x cols matrix of elem-byte elements, copied as its transpose (a strided view) into a
 * contiguous cols x rows one, for every element size. */
TD_TEST(cuda_strided_copy_transposed, CUDA_CASE)
{
    need_kernels();
    const int64_t rows = 37, cols = 53;
    const size_t sizes[] = {1, 2, 4, 8, 16};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t elem = sizes[k];
        size_t nbytes = (size_t)(rows * cols) * elem;
        unsigned char *host = malloc(nbytes), *back = calloc(1, nbytes);
        TD_CHECK(host && back);
        for (size_t i = 0; i < nbytes; i++)
            host[i] = (unsigned char)(i * 29u + k);
        void *src = dev_alloc(nbytes), *dst = dev_alloc(nbytes);
        to_device(src, host, nbytes);

        device_strided view = {.base = src, .ndim = 2}; /* src.t(): (cols, rows), strides (1, cols) */
        view.sizes[0] = cols;
        view.sizes[1] = rows;
        view.strides[0] = 1;
        view.strides[1] = cols;
        device_strided out = {.base = dst, .ndim = 2};
        out.sizes[0] = cols;
        out.sizes[1] = rows;
        out.strides[0] = rows;
        out.strides[1] = 1;
        TD_CHECK_OK(CUDA_IMPL.strided_copy(0, &out, &view, elem, NULL));
        to_host(back, dst, nbytes);
        for (int64_t c = 0; c < cols; c++)
            for (int64_t r = 0; r < rows; r++)
                TD_CHECK_MSG(memcmp(back + (size_t)(c * rows + r) * elem, host + (size_t)(r * cols + c) * elem,
                                    elem) == 0,
                             "elem size %zu: out[%lld][%lld] differs from src[%lld][%lld]", elem, (long long)c,
                             (long long)r, (long long)r, (long long)c);

        /* And back, flattened: a 1-D destination of the same element count. */
        memset(back, 0, nbytes);
        device_strided flat = {.base = src, .ndim = 1};
        flat.sizes[0] = rows * cols;
        flat.strides[0] = 1;
        device_strided transposed_back = {.base = dst, .ndim = 2};
        transposed_back.sizes[0] = rows;
        transposed_back.sizes[1] = cols;
        transposed_back.strides[0] = 1;
        transposed_back.strides[1] = rows;
        TD_CHECK_OK(CUDA_IMPL.strided_copy(0, &flat, &transposed_back, elem, NULL));
        to_host(back, src, nbytes);
        TD_CHECK_MSG(memcmp(back, host, nbytes) == 0, "elem size %zu: transposing twice changed the data", elem);

        CUDA_IMPL.device_free(0, src);
        CUDA_IMPL.device_free(0, dst);
        free(host);
        free(back);
    }
    device_strided a = {.base = NULL, .ndim = 1}, b = {.base = NULL, .ndim = 1};
    a.sizes[0] = 3;
    a.strides[0] = 1;
    b.sizes[0] = 4;
    b.strides[0] = 1;
    TD_CHECK_ERR(CUDA_IMPL.strided_copy(0, &a, &b, 4, NULL), TD_ERR_INVALID, "elements");
    CUDA_IMPL.shutdown();
}

/* out = a + b for n elements of dtype through device buffers of nbytes each (inputs and output
 * alike), copied in and out on the default stream. */
static void add_on_device(void *out, const void *a, const void *b, size_t nbytes, size_t n, td_dtype dtype)
{
    void *da = dev_alloc(nbytes), *db = dev_alloc(nbytes), *dout = dev_alloc(nbytes);
    to_device(da, a, nbytes);
    to_device(db, b, nbytes);
    TD_CHECK_OK(CUDA_IMPL.add(0, dout, da, db, n, dtype, NULL));
    to_host(out, dout, nbytes);
    CUDA_IMPL.device_free(0, da);
    CUDA_IMPL.device_free(0, db);
    CUDA_IMPL.device_free(0, dout);
}

TD_TEST(cuda_add, CUDA_CASE)
{
    need_kernels();
    enum { N = 3000 };
    /* float32 */
    static float fa[N], fb[N], fo[N];
    for (int i = 0; i < N; i++) {
        fa[i] = (float)i * 0.37f - 100.0f;
        fb[i] = 1.0f / (float)(i + 1);
    }
    float *da = dev_alloc(sizeof fa), *db = dev_alloc(sizeof fb), *dout = dev_alloc(sizeof fo);
    to_device(da, fa, sizeof fa);
    to_device(db, fb, sizeof fb);
    TD_CHECK_OK(CUDA_IMPL.add(0, dout, da, db, N, TD_FLOAT32, NULL));
    to_host(fo, dout, sizeof fo);
    for (int i = 0; i < N; i++) {
        volatile float want = fa[i] + fb[i];
        TD_CHECK_MSG(fo[i] == want, "float32 add: element %d is %.9g, want %.9g", i, (double)fo[i], (double)want);
    }
    /* In place: a += b. */
    TD_CHECK_OK(CUDA_IMPL.add(0, da, da, db, N, TD_FLOAT32, NULL));
    to_host(fo, da, sizeof fo);
    for (int i = 0; i < N; i++) {
        volatile float want = fa[i] + fb[i];
        TD_CHECK_MSG(fo[i] == want, "in-place float32 add: element %d", i);
    }
    CUDA_IMPL.device_free(0, da);
    CUDA_IMPL.device_free(0, db);
    CUDA_IMPL.device_free(0, dout);

    /* int64, wrapping as torch does. */
    static int64_t ia[N], ib[N], io[N];
    for (int i = 0; i < N; i++) {
        ia[i] = (int64_t)i * 1000000007LL * 1000LL - 5;
        ib[i] = -(int64_t)i * 3;
    }
    ia[0] = INT64_MAX;
    ib[0] = 1;
    add_on_device(io, ia, ib, sizeof io, N, TD_INT64);
    TD_CHECK(io[0] == INT64_MIN);
    for (int i = 1; i < N; i++)
        TD_CHECK_MSG(io[i] == ia[i] + ib[i], "int64 add: element %d is %lld, want %lld", i, (long long)io[i],
                     (long long)(ia[i] + ib[i]));

    /* float16: computed in float, rounded to nearest even (1024 + 0.5 ties to 1024). */
    static uint16_t ha[N], hb[N], ho[N];
    for (int i = 0; i < N; i++) {
        ha[i] = float_to_half((float)(i % 500) * 0.25f - 40.0f);
        hb[i] = float_to_half((float)(i % 97) * 0.125f + 0.5f);
    }
    ha[1] = float_to_half(1024.0f);
    hb[1] = float_to_half(0.5f);
    ha[2] = float_to_half(1025.0f);
    hb[2] = float_to_half(0.5f);
    add_on_device(ho, ha, hb, sizeof ho, N, TD_FLOAT16);
    TD_CHECK_EQ(half_to_float(ho[1]), 1024.0f);
    TD_CHECK_EQ(half_to_float(ho[2]), 1026.0f);
    for (int i = 0; i < N; i++) {
        uint16_t want = float_to_half(half_to_float(ha[i]) + half_to_float(hb[i]));
        TD_CHECK_MSG(ho[i] == want, "float16 add: element %d is 0x%04x (%g), want 0x%04x (%g)", i, ho[i],
                     (double)half_to_float(ho[i]), want, (double)half_to_float(want));
    }

    /* bfloat16 (256 + 1 ties to 256) and complex128. */
    {
        const float av[4] = {1.0f, 3.140625f, -2.5f, 256.0f}, bv[4] = {0.5f, 0.0078125f, 2.5f, 1.0f};
        uint16_t ga[4], gb[4], go[4];
        for (int i = 0; i < 4; i++) {
            ga[i] = float_to_bf16(av[i]);
            gb[i] = float_to_bf16(bv[i]);
        }
        add_on_device(go, ga, gb, sizeof go, 4, TD_BFLOAT16);
        TD_CHECK_EQ(bf16_to_float(go[3]), 256.0f);
        for (int i = 0; i < 4; i++) {
            uint16_t want = float_to_bf16(bf16_to_float(ga[i]) + bf16_to_float(gb[i]));
            TD_CHECK_MSG(go[i] == want, "bfloat16 add: element %d is %g, want %g", i, (double)bf16_to_float(go[i]),
                         (double)bf16_to_float(want));
        }

        const double za[4] = {1.5, -2.0, 1e300, 0.0}, zb[4] = {0.25, 4.0, -1e300, -0.5};
        double zo[4];
        add_on_device(zo, za, zb, sizeof zo, 2, TD_COMPLEX128);
        TD_CHECK(zo[0] == 1.75 && zo[1] == 2.0 && zo[2] == 0.0 && zo[3] == -0.5);
    }

    /* bool is logical or; int8 wraps. */
    unsigned char ba[4] = {0, 0, 1, 2}, bb[4] = {0, 3, 0, 1}, bo[4];
    add_on_device(bo, ba, bb, 4, 4, TD_BOOL);
    TD_CHECK(bo[0] == 0 && bo[1] == 1 && bo[2] == 1 && bo[3] == 1);
    int8_t ca[2] = {127, -128}, cb[2] = {1, -1}, co[2];
    add_on_device(co, ca, cb, 2, 2, TD_INT8);
    TD_CHECK(co[0] == -128 && co[1] == 127);
    /* No elements: nothing to do, and no error. */
    int8_t none[2];
    add_on_device(none, ca, cb, 2, 0, TD_INT8);
    CUDA_IMPL.shutdown();
}

/* ---- streams and events ------------------------------------------------------------------------ */

TD_TEST(cuda_sleep_query_synchronize, CUDA_CASE)
{
    need_kernels();
    void *stream = NULL;
    TD_CHECK_OK(CUDA_IMPL.stream_create(0, 0, &stream));
    /* The first launch loads the kernels; warm up so the timed spin starts right away. */
    TD_CHECK_OK(CUDA_IMPL.sleep(0, 10, stream));
    TD_CHECK_OK(CUDA_IMPL.stream_synchronize(0, stream));
    TD_CHECK_EQ(CUDA_IMPL.stream_query(0, stream), 1);

    TD_CHECK_OK(CUDA_IMPL.sleep(0, FIFTY_MIL_CYCLES, stream));
    TD_CHECK_EQ(CUDA_IMPL.stream_query(0, stream), 0);
    TD_CHECK_OK(CUDA_IMPL.stream_synchronize(0, stream));
    TD_CHECK_EQ(CUDA_IMPL.stream_query(0, stream), 1);

    /* The legacy default stream (NULL). */
    TD_CHECK_OK(CUDA_IMPL.sleep(0, FIFTY_MIL_CYCLES, NULL));
    TD_CHECK_EQ(CUDA_IMPL.stream_query(0, NULL), 0);
    TD_CHECK_OK(CUDA_IMPL.device_synchronize(0));
    TD_CHECK_EQ(CUDA_IMPL.stream_query(0, NULL), 1);

    /* A stream waits for an event recorded on another one. */
    void *other = NULL, *event = NULL;
    TD_CHECK_OK(CUDA_IMPL.stream_create(0, 0, &other));
    TD_CHECK_OK(CUDA_IMPL.event_create(0, TD_EVENT_DEFAULT, &event));
    TD_CHECK_OK(CUDA_IMPL.sleep(0, FIFTY_MIL_CYCLES, stream));
    TD_CHECK_OK(CUDA_IMPL.event_record(0, event, stream));
    TD_CHECK_OK(CUDA_IMPL.stream_wait_event(0, other, event));
    TD_CHECK_EQ(CUDA_IMPL.stream_query(0, other), 0);
    TD_CHECK_OK(CUDA_IMPL.stream_synchronize(0, other));
    TD_CHECK_EQ(CUDA_IMPL.event_query(0, event), 1);
    TD_CHECK_EQ(CUDA_IMPL.stream_query(0, stream), 1);

    CUDA_IMPL.event_destroy(0, event);
    CUDA_IMPL.stream_destroy(0, other);
    CUDA_IMPL.stream_destroy(0, stream);
    CUDA_IMPL.stream_destroy(0, NULL);
    CUDA_IMPL.shutdown();
}

TD_TEST(cuda_event_elapsed_time, CUDA_CASE)
{
    need_kernels();
    void *stream = NULL, *start = NULL, *end = NULL;
    TD_CHECK_OK(CUDA_IMPL.stream_create(0, 0, &stream));
    TD_CHECK_OK(CUDA_IMPL.event_create(0, TD_EVENT_ENABLE_TIMING, &start));
    TD_CHECK_OK(CUDA_IMPL.event_create(0, TD_EVENT_ENABLE_TIMING | TD_EVENT_BLOCKING, &end));
    TD_CHECK_OK(CUDA_IMPL.sleep(0, 10, stream)); /* loads the kernels */
    TD_CHECK_OK(CUDA_IMPL.event_record(0, start, stream));
    TD_CHECK_OK(CUDA_IMPL.sleep(0, FIFTY_MIL_CYCLES, stream));
    TD_CHECK_OK(CUDA_IMPL.event_record(0, end, stream));
    TD_CHECK_EQ(CUDA_IMPL.event_query(0, end), 0);
    TD_CHECK_OK(CUDA_IMPL.event_synchronize(0, end));
    TD_CHECK_EQ(CUDA_IMPL.event_query(0, end), 1);
    TD_CHECK_EQ(CUDA_IMPL.event_query(0, start), 1);
    float ms = 0;
    TD_CHECK_OK(CUDA_IMPL.event_elapsed_ms(0, start, end, &ms));
    /* 50M cycles at a clock of at most ~2.5 GHz: at least 20 ms; no tighter bound is portable. */
    TD_CHECK_MSG(ms > 1.0f, "elapsed %g ms around a 50M-cycle sleep", (double)ms);
    TD_CHECK_MSG(ms < 60000.0f, "elapsed %g ms around a 50M-cycle sleep", (double)ms);

    CUDA_IMPL.event_destroy(0, start);
    CUDA_IMPL.event_destroy(0, end);
    CUDA_IMPL.stream_destroy(0, stream);
    CUDA_IMPL.shutdown();
}

TD_TEST(cuda_event_timing_disabled, CUDA_CASE)
{
    need_kernels();
    void *start = NULL, *end = NULL, *ipc = NULL;
    TD_CHECK_OK(CUDA_IMPL.event_create(0, TD_EVENT_DEFAULT, &start));
    TD_CHECK_OK(CUDA_IMPL.event_create(0, TD_EVENT_DEFAULT, &end));
    TD_CHECK_OK(CUDA_IMPL.event_record(0, start, NULL));
    TD_CHECK_OK(CUDA_IMPL.sleep(0, 1000, NULL));
    TD_CHECK_OK(CUDA_IMPL.event_record(0, end, NULL));
    TD_CHECK_OK(CUDA_IMPL.event_synchronize(0, end));
    float ms = -1;
    td_status s = CUDA_IMPL.event_elapsed_ms(0, start, end, &ms);
    TD_CHECK_MSG(s < 0, "elapsed time between timing-disabled events succeeded (%g ms)", (double)ms);
    TD_CHECK_CONTAINS(td_last_error(), "CUDA error: ");
    TD_CHECK_CONTAINS(td_last_error(), "(cuEventElapsedTime)");

    /* An interprocess event gives a 64-byte handle once recorded. */
    TD_CHECK_OK(CUDA_IMPL.event_create(0, TD_EVENT_INTERPROCESS | TD_EVENT_ENABLE_TIMING, &ipc));
    TD_CHECK_OK(CUDA_IMPL.event_record(0, ipc, NULL));
    td_event_ipc_handle handle;
    memset(&handle, 0xa5, sizeof handle);
    TD_CHECK_OK(CUDA_IMPL.event_ipc_handle(0, ipc, &handle));
    bool nonzero = false;
    for (int i = 0; i < 64; i++)
        nonzero |= handle.bytes[i] != 0;
    TD_CHECK(nonzero);
    for (size_t i = 64; i < sizeof handle.bytes; i++)
        TD_CHECK_EQ(handle.bytes[i], 0);
    TD_CHECK_OK(CUDA_IMPL.event_synchronize(0, ipc));

    CUDA_IMPL.event_destroy(0, ipc);
    CUDA_IMPL.event_destroy(0, start);
    CUDA_IMPL.event_destroy(0, end);
    CUDA_IMPL.shutdown();
}

TD_TEST(cuda_stream_priorities, CUDA_CASE)
{
    need_kernels();
    int least = 1, greatest = 1;
    TD_CHECK_OK(CUDA_IMPL.stream_priority_range(0, &least, &greatest));
    TD_CHECK_EQ(least, 0);
    TD_CHECK_MSG(greatest < 0, "greatest priority %d", greatest);
    void *low = NULL, *high = NULL;
    TD_CHECK_OK(CUDA_IMPL.stream_create(0, least, &low));
    TD_CHECK_OK(CUDA_IMPL.stream_create(0, greatest, &high));
    TD_CHECK(low != NULL && high != NULL && low != high);
    TD_CHECK_OK(CUDA_IMPL.sleep(0, 1000, low));
    TD_CHECK_OK(CUDA_IMPL.sleep(0, 1000, high));
    TD_CHECK_OK(CUDA_IMPL.stream_synchronize(0, low));
    TD_CHECK_OK(CUDA_IMPL.stream_synchronize(0, high));
    TD_CHECK_EQ(CUDA_IMPL.stream_query(0, low), 1);
    TD_CHECK_EQ(CUDA_IMPL.stream_query(0, high), 1);
    CUDA_IMPL.stream_destroy(0, low);
    CUDA_IMPL.stream_destroy(0, high);
    CUDA_IMPL.shutdown();
}

TD_TEST_MAIN()
