/* reduce_bench: memory bandwidth of the reduce kernels (td_reduce_kernel) beside memcpy and a plain
 * read-add-write loop, so that one table shows whether the kernels run at memory speed.
 *
 * Each kernel runs on operands of SIZE MiB each (default 64, far beyond the caches) out of place
 * (dst = a op b: three distinct buffers) and in place (a = a op b, what the collectives do), in
 * its baseline (SSE2) build and its AVX2 build (what td_reduce_kernel picks on AVX2 CPUs), and
 * counts 3 * n * element size bytes moved (two reads, one write). memcpy counts 2 * size. The
 * figure is the best of REPS rounds (default 5; each round times every kernel once, after a
 * warm-up run), as GB/s (10^9 bytes).
 *
 * Usage: reduce_bench [SIZE_MIB [REPS]] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/tensor.h>

#include "tensor/reduce.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t g_bytes;
static int g_reps;
static unsigned char *g_a, *g_b, *g_d;

typedef void (*body_fn)(void *arg);

/* Time of one run after one warm-up run. */
static double time_once(body_fn body, void *arg)
{
    body(arg);
    double t0 = now_s();
    body(arg);
    return now_s() - t0;
}

typedef struct kernel_arg {
    td_reduce_fn fn;
    size_t count;
    bool in_place;
} kernel_arg;

static void run_kernel(void *varg)
{
    kernel_arg *k = varg;
    if (k->in_place)
        k->fn(g_a, g_a, g_b, k->count);
    else
        k->fn(g_d, g_a, g_b, k->count);
}

static void run_memcpy(void *arg) { memcpy(g_d, g_a, g_bytes); }

/* The reference the kernels should match: the simplest loop gcc vectorizes. */
static void __attribute__((noinline)) plain_add(float *restrict a, const float *restrict b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] += b[i];
}

static void run_plain(void *arg) { plain_add((float *)g_a, (const float *)g_b, g_bytes / sizeof(float)); }

/* Operands hold small values of the dtype (so float16 sums stay finite and nothing is
 * denormal, which would measure the FPU's slow path instead of the kernel). */
static void fill_operands(td_dtype dtype)
{
    size_t es = td_dtype_size(dtype), n = g_bytes / es;
    td_tensor *ta = NULL, *tb = NULL;
    if (td_tensor_empty(TD_FLOAT64, TD_SHAPE((int64_t)n), &ta) != TD_OK)
        goto fail;
    double *v = td_tensor_data(ta);
    for (size_t i = 0; i < n; i++)
        v[i] = (double)(i % 7 + 1);
    if (td_tensor_to(ta, dtype, &tb) != TD_OK)
        goto fail;
    memcpy(g_a, td_tensor_data(tb), g_bytes);
    memcpy(g_b, td_tensor_data(tb), g_bytes);
    memcpy(g_d, td_tensor_data(tb), g_bytes);
    td_tensor_release(ta);
    td_tensor_release(tb);
    return;
fail:
    fprintf(stderr, "reduce_bench: preparing operands: %s\n", td_last_error());
    exit(1);
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
    g_reps = argc > 2 ? atoi(argv[2]) : 5;
    if (mib == 0 || g_reps <= 0) {
        fprintf(stderr, "usage: reduce_bench [SIZE_MIB [REPS]]\n");
        return 2;
    }
    g_bytes = mib << 20;
    if (posix_memalign((void **)&g_a, 64, g_bytes) || posix_memalign((void **)&g_b, 64, g_bytes) ||
        posix_memalign((void **)&g_d, 64, g_bytes)) {
        fprintf(stderr, "reduce_bench: cannot allocate 3 x %zu MiB\n", mib);
        return 1;
    }
    memset(g_a, 1, g_bytes);
    memset(g_b, 1, g_bytes);
    memset(g_d, 1, g_bytes);

    printf("operands: %zu MiB each, best of %d runs; GB/s = bytes read + written / time\n\n", mib, g_reps);
    bool avx2 = reduce_isa_available(TD_REDUCE_ISA_AVX2);
    printf("| kernel | baseline out of place | baseline in place | AVX2 out of place | AVX2 in place |\n");
    printf("| --- | ---: | ---: | ---: | ---: |\n");
    static const struct {
        td_reduce_op op;
        td_dtype dtype;
    } cases[] = {
        {TD_SUM, TD_FLOAT32},  {TD_SUM, TD_FLOAT16},  {TD_SUM, TD_BFLOAT16}, {TD_SUM, TD_FLOAT64},
        {TD_SUM, TD_INT32},    {TD_SUM, TD_INT64},    {TD_SUM, TD_UINT8},    {TD_SUM, TD_COMPLEX64},
        {TD_MAX, TD_FLOAT32},  {TD_MIN, TD_FLOAT64},  {TD_MAX, TD_FLOAT16},  {TD_MAX, TD_BFLOAT16},
        {TD_MAX, TD_INT32},    {TD_MIN, TD_INT64},    {TD_PRODUCT, TD_FLOAT32}, {TD_PRODUCT, TD_INT64},
        {TD_PRODUCT, TD_COMPLEX64}, {TD_BXOR, TD_INT64},   {TD_BAND, TD_UINT8},   {TD_SUM, TD_BOOL},
    };
    enum { NCASES = sizeof cases / sizeof cases[0] };
    /* Best time per (case, isa, in place), over rounds that each visit every case once, so that
     * a burst of load from other processes costs one sample of each case rather than all samples
     * of one. */
    double best[NCASES][2][2], best_memcpy = 1e30, best_plain = 1e30;
    for (size_t i = 0; i < NCASES; i++)
        best[i][0][0] = best[i][0][1] = best[i][1][0] = best[i][1][1] = 1e30;
    for (int round = 0; round < g_reps; round++) {
        double t = time_once(run_memcpy, NULL);
        best_memcpy = t < best_memcpy ? t : best_memcpy;
        fill_operands(TD_FLOAT32);
        t = time_once(run_plain, NULL);
        best_plain = t < best_plain ? t : best_plain;
        for (size_t i = 0; i < NCASES; i++) {
            fill_operands(cases[i].dtype);
            for (int isa = 0; isa < (avx2 ? 2 : 1); isa++) {
                td_reduce_fn fn = reduce_kernel_isa(cases[i].op, cases[i].dtype,
                                                       isa ? TD_REDUCE_ISA_AVX2 : TD_REDUCE_ISA_BASELINE);
                if (!fn) {
                    fprintf(stderr, "reduce_bench: %s\n", td_last_error());
                    return 1;
                }
                kernel_arg k = {.fn = fn, .count = g_bytes / td_dtype_size(cases[i].dtype)};
                for (int in_place = 0; in_place < 2; in_place++) {
                    k.in_place = in_place;
                    t = time_once(run_kernel, &k);
                    best[i][isa][in_place] = t < best[i][isa][in_place] ? t : best[i][isa][in_place];
                }
            }
        }
    }
    double moved = 3.0 * (double)g_bytes / 1e9;
    printf("| memcpy (2 x size) | %.1f | | | |\n", 2.0 * (double)g_bytes / 1e9 / best_memcpy);
    printf("| plain loop a[i] += b[i] (float32, baseline) | | %.1f | | |\n", moved / best_plain);
    for (size_t i = 0; i < NCASES; i++) {
        printf("| %s %s | %.1f | %.1f |", td_dtype_name(cases[i].dtype), td_reduce_op_name(cases[i].op),
               moved / best[i][0][0], moved / best[i][0][1]);
        if (avx2)
            printf(" %.1f | %.1f |\n", moved / best[i][1][0], moved / best[i][1][1]);
        else
            printf(" n/a | n/a |\n");
    }
    free(g_a);
    free(g_b);
    free(g_d);
    return 0;
}
