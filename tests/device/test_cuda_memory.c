/* The caching device allocator, its statistics and the pinned host cache (spec/cuda_multigpu.md
 * sections 2 and 6). The first cases are named after the test_cuda_multigpu.py tests they port:
 * the memory-stats generator of 2.6 (td_device_malloc of a FloatTensor's bytes stands in for the
 * tensor) with the 2.4 consistency check against the snapshot after every step, mem_get_info, the
 * leak checker of 2.7, and the pinned block reused too soon; the others check the allocator's
 * own rules (rounding, splitting, stream-ordered reuse, record_stream, OOM) through snapshots. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/device.h>
#include <tdist/testing.h>

#include "device/device_impl.h"
#include "device_util.h"

#define MIB ((size_t)1 << 20)
#define MAX_DEVS 64

/* ---- helpers -------------------------------------------------------------------------------- */

static int64_t stat_of(td_device d, const char *key)
{
    td_memory_stats stats;
    TD_CHECK_OK(td_memory_stats_get(d, &stats));
    int64_t v = 0;
    TD_CHECK_OK(td_memory_stats_lookup(&stats, key, &v));
    return v;
}

static void *dmalloc(td_device d, size_t nbytes, td_stream *s)
{
    void *p = NULL;
    TD_CHECK_OK(td_device_malloc(d, nbytes, s, &p));
    return p;
}

/* A spin of about ms milliseconds queued on s. */
static void stream_sleep_ms(td_stream *s, int64_t ms)
{
    td_device_properties props;
    TD_CHECK_OK(td_device_get_properties(td_stream_device(s), &props));
    TD_CHECK_OK(td_stream_sleep(s, ms * (int64_t)props.clock_rate_khz));
}

static const char *const families[TD_STAT_FAMILY_COUNT] = {
    "allocation",     "segment",      "active",       "inactive_split",  "allocated_bytes",
    "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
};

/* _check_memory_stat_consistency (spec 2.4): what the snapshot implies for every device it shows,
 * compared with memory_stats for every key the walk touched. */
static void check_consistency(td_device_type type)
{
    static int64_t expected[MAX_DEVS][TD_STAT_FAMILY_COUNT][TD_POOL_COUNT];
    static bool touched[MAX_DEVS][TD_STAT_FAMILY_COUNT][TD_POOL_COUNT];
    bool seen[MAX_DEVS] = {false};
    memset(expected, 0, sizeof expected);
    memset(touched, 0, sizeof touched);
    td_memory_snapshot snap;
    TD_CHECK_OK(td_memory_snapshot_get(type, &snap));
    for (size_t i = 0; i < snap.segment_count; i++) {
        const td_memory_segment *seg = &snap.segments[i];
        TD_CHECK(seg->device.type == type);
        int d = seg->device.index;
        TD_CHECK(d >= 0 && d < MAX_DEVS);
        seen[d] = true;
        int pools[2] = {TD_POOL_ALL, seg->is_large ? TD_POOL_LARGE : TD_POOL_SMALL};
#define ADD(fam, amount)                          \
    for (int k = 0; k < 2; k++) {                 \
        expected[d][fam][pools[k]] += (amount);   \
        touched[d][fam][pools[k]] = true;         \
    }
        if (!seg->is_expandable)
            ADD(TD_STAT_SEGMENT, 1);
        ADD(TD_STAT_ALLOCATED_BYTES, (int64_t)seg->allocated_size);
        ADD(TD_STAT_RESERVED_BYTES, (int64_t)seg->total_size);
        ADD(TD_STAT_ACTIVE_BYTES, (int64_t)seg->active_size);
        ADD(TD_STAT_REQUESTED_BYTES, (int64_t)seg->requested_size);
        uint64_t sum_requested = 0;
        for (size_t b = 0; b < seg->block_count; b++) {
            const td_memory_block *blk = &seg->blocks[b];
            if (blk->state == TD_BLOCK_ACTIVE_ALLOCATED)
                ADD(TD_STAT_ALLOCATION, 1);
            if (blk->state == TD_BLOCK_ACTIVE_ALLOCATED || blk->state == TD_BLOCK_ACTIVE_PENDING_FREE) {
                ADD(TD_STAT_ACTIVE, 1);
                sum_requested += blk->requested_size;
            }
            if (blk->state == TD_BLOCK_INACTIVE && seg->block_count > 1 && !seg->is_expandable) {
                ADD(TD_STAT_INACTIVE_SPLIT, 1);
                ADD(TD_STAT_INACTIVE_SPLIT_BYTES, (int64_t)blk->size);
            }
        }
#undef ADD
        TD_CHECK_EQ(sum_requested, seg->requested_size);
    }
    td_memory_snapshot_free(&snap);
    static const char *const pool_names[TD_POOL_COUNT] = {"all", "small_pool", "large_pool"};
    for (int d = 0; d < MAX_DEVS; d++) {
        if (!seen[d])
            continue;
        td_device dv = {type, d};
        td_memory_stats stats;
        TD_CHECK_OK(td_memory_stats_get(dv, &stats));
        for (int f = 0; f < TD_STAT_FAMILY_COUNT; f++)
            for (int p = 0; p < TD_POOL_COUNT; p++) {
                if (!touched[d][f][p])
                    continue;
                char key[64];
                snprintf(key, sizeof key, "%s.%s.current", families[f], pool_names[p]);
                int64_t v = 0;
                TD_CHECK_OK(td_memory_stats_lookup(&stats, key, &v));
                TD_CHECK_MSG(v == expected[d][f][p], "device %d: %s is %lld, the snapshot says %lld", d, key,
                             (long long)v, (long long)expected[d][f][p]);
            }
    }
}

/* ---- the memory stats generator (spec 2.6) ---------------------------------------------------- */

typedef struct fake_tensor {
    void *ptr;
    int64_t numel; /* float32 elements */
} fake_tensor;

typedef struct stats_gen {
    td_device device;
    int step; /* the next yield point */
    int64_t m0, m1;
    int64_t last_m, max_m, last_r, max_r;
    fake_tensor tensors1[3];
    fake_tensor tensors2[64];
    int ntensors2;
    uint64_t rng;
} stats_gen;

static fake_tensor gen_alloc(stats_gen *g, int64_t numel)
{
    fake_tensor t = {dmalloc(g->device, (size_t)numel * 4, NULL), numel};
    TD_CHECK((t.ptr == NULL) == (numel == 0));
    return t;
}

/* comp > 0: allocated increased, 0: unchanged, < 0: decreased; then the peak and cache checks. */
static void assert_change(stats_gen *g, int comp, bool empty_cache, bool reset_peak)
{
    td_device d = g->device;
    int64_t new_m = td_memory_allocated(d), new_max_m = td_max_memory_allocated(d);
    if (comp > 0)
        TD_CHECK_MSG(new_m > g->last_m, "step %d: allocated %lld did not grow from %lld", g->step, (long long)new_m,
                     (long long)g->last_m);
    else if (comp < 0)
        TD_CHECK_MSG(new_m < g->last_m, "step %d: allocated %lld did not drop from %lld", g->step, (long long)new_m,
                     (long long)g->last_m);
    else
        TD_CHECK_MSG(new_m == g->last_m, "step %d: allocated %lld changed from %lld", g->step, (long long)new_m,
                     (long long)g->last_m);
    TD_CHECK(new_m <= new_max_m);
    TD_CHECK(new_max_m >= g->max_m);
    g->last_m = new_m;
    g->max_m = new_max_m;

    int64_t new_r = td_memory_reserved(d), new_max_r = td_max_memory_reserved(d);
    TD_CHECK(new_r <= new_max_r);
    TD_CHECK(new_max_r >= g->max_r);
    g->last_r = new_r;
    g->max_r = new_max_r;

    if (empty_cache) {
        int64_t sync1 = stat_of(d, "num_sync_all_streams"), alloc1 = stat_of(d, "num_device_alloc"),
                free1 = stat_of(d, "num_device_free");
        TD_CHECK(sync1 >= 0);
        TD_CHECK(alloc1 >= (new_m == 0 ? 0 : 1));
        TD_CHECK(free1 >= 0);
        TD_CHECK_OK(td_device_empty_cache());
        TD_CHECK_EQ(stat_of(d, "num_sync_all_streams"), sync1 + 1);
        TD_CHECK(stat_of(d, "num_device_alloc") >= alloc1);
        TD_CHECK(stat_of(d, "num_device_free") >= free1);
        new_r = td_memory_reserved(d);
        new_max_r = td_max_memory_reserved(d);
        TD_CHECK(new_r <= g->last_r);
        TD_CHECK(new_r <= new_max_r);
        TD_CHECK_EQ(new_max_r, g->max_r);
        TD_CHECK_EQ(td_memory_allocated(d), g->last_m);
        g->last_r = new_r;
    }
    if (reset_peak) {
        TD_CHECK_OK(td_memory_reset_peak_stats(d));
        TD_CHECK_EQ(td_memory_allocated(d), g->last_m);
        TD_CHECK_EQ(td_max_memory_allocated(d), g->last_m);
        g->max_m = g->last_m;
        TD_CHECK_EQ(td_memory_reserved(d), g->last_r);
        TD_CHECK_EQ(td_max_memory_reserved(d), g->last_r);
        g->max_r = g->last_r;
    }
}

static void gen_init(stats_gen *g, td_device d, uint64_t seed)
{
    memset(g, 0, sizeof *g);
    g->device = d;
    g->rng = seed;
    g->m0 = g->last_m = td_memory_allocated(d);
    g->max_m = td_max_memory_allocated(d);
    g->last_r = td_memory_reserved(d);
    g->max_r = td_max_memory_reserved(d);
}

static uint64_t gen_random(uint64_t *state)
{
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return *state >> 33;
}

/* N = 35: small allocations i = 1..17, large i = 5..21, deletes 17, new ones i = 2..24. */
enum { GEN_SMALL = 17, GEN_LARGE = 17, GEN_DELETE = 17, GEN_REFILL = 23 };

/* Runs up to the generator's next yield; false once it has finished. */
static bool gen_next(stats_gen *g)
{
    int s = g->step++;
    if (s == 0) {
        assert_change(g, 0, false, false);
        assert_change(g, 0, false, true);
        assert_change(g, 0, true, false);
        assert_change(g, 0, false, true);
        assert_change(g, 0, false, false);
        return true;
    }
    s -= 1;
    if (s == 0) {
        g->tensors1[0] = gen_alloc(g, 1);
        g->tensors1[1] = gen_alloc(g, 10 * 20);
        g->tensors1[2] = gen_alloc(g, 200LL * 300 * 2000);
        g->m1 = td_memory_allocated(g->device);
        assert_change(g, 1, false, false);
        return true;
    }
    s -= 1;
    if (s < GEN_SMALL) {
        int64_t i = s + 1;
        g->tensors2[g->ntensors2++] = gen_alloc(g, i * i * 4);
        assert_change(g, 1, false, false);
        return true;
    }
    s -= GEN_SMALL;
    if (s < GEN_LARGE) {
        int64_t i = s + 5;
        g->tensors2[g->ntensors2++] = gen_alloc(g, i * (i * 7) * (i * 9) * (i * 11));
        assert_change(g, 1, false, i % 2 == 0);
        return true;
    }
    s -= GEN_LARGE;
    if (s == 0) {
        g->tensors2[g->ntensors2++] = gen_alloc(g, 0);
        assert_change(g, 0, false, false);
        return true;
    }
    s -= 1;
    /* The permutation: taking references changes nothing (one step per element). */
    if (s < GEN_SMALL + GEN_LARGE + 1) {
        if (s == 0)
            for (int i = g->ntensors2 - 1; i > 0; i--) {
                int j = (int)(gen_random(&g->rng) % (uint64_t)(i + 1));
                fake_tensor t = g->tensors2[i];
                g->tensors2[i] = g->tensors2[j];
                g->tensors2[j] = t;
            }
        assert_change(g, 0, false, false);
        return true;
    }
    s -= GEN_SMALL + GEN_LARGE + 1;
    if (s < 3) { /* del tensors2; tensors2 = permute; del permute */
        assert_change(g, 0, false, s == 2);
        return true;
    }
    s -= 3;
    if (s < GEN_DELETE) {
        int i = s;
        int64_t numel = g->tensors2[i].numel;
        td_device_free(g->tensors2[i].ptr);
        memmove(&g->tensors2[i], &g->tensors2[i + 1], (size_t)(g->ntensors2 - i - 1) * sizeof(fake_tensor));
        g->ntensors2--;
        assert_change(g, numel > 0 ? -1 : 0, false, false);
        return true;
    }
    s -= GEN_DELETE;
    if (s < GEN_REFILL) {
        int64_t i = s + 2;
        g->tensors2[g->ntensors2++] = gen_alloc(g, i * (i * 3) * (i * 8));
        assert_change(g, 1, false, false);
        return true;
    }
    s -= GEN_REFILL;
    if (s == 0) {
        for (int i = 0; i < g->ntensors2; i++)
            td_device_free(g->tensors2[i].ptr);
        g->ntensors2 = 0;
        assert_change(g, -1, false, true);
        assert_change(g, 0, false, false);
        TD_CHECK_EQ(td_memory_allocated(g->device), g->m1);
        return true;
    }
    s -= 1;
    if (s == 0) {
        for (int i = 0; i < 3; i++)
            td_device_free(g->tensors1[i].ptr);
        memset(g->tensors1, 0, sizeof g->tensors1);
        assert_change(g, -1, false, true);
        TD_CHECK_EQ(td_memory_allocated(g->device), g->m0);
        assert_change(g, 0, true, false);
        assert_change(g, 0, false, true);
    }
    return false;
}

/* ---- ported tests --------------------------------------------------------------------------- */

TD_TEST(test_memory_stats, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    TD_CHECK_OK(td_device_empty_cache());
    stats_gen g;
    gen_init(&g, dev(0), 1);
    int steps = 0;
    bool more;
    do {
        more = gen_next(&g);
        check_consistency(type);
        steps++;
    } while (more);
    /* 1 + 1 + 17 + 17 + 1 + 35 + 3 + 17 + 23 + 1 + the last */
    TD_CHECK_EQ(steps, 117);
    TD_CHECK_EQ(td_memory_allocated(dev(0)), 0);
    TD_CHECK_EQ(td_memory_reserved(dev(0)), 0);
    dev_teardown();
}

TD_TEST(test_memory_stats_multigpu, DEV_CASE)
{
    dev_setup(ctx, 2);
    /* Strictly interleaved. */
    TD_CHECK_OK(td_device_empty_cache());
    stats_gen g0, g1;
    gen_init(&g0, dev(0), 1);
    gen_init(&g1, dev(1), 2);
    bool end0 = false, end1 = false;
    while (!(end0 && end1)) {
        if (!end0)
            end0 = !gen_next(&g0);
        if (!end1)
            end1 = !gen_next(&g1);
    }
    /* Semi-random: gen1 advances 0-2 steps per gen0 step, all remaining steps once gen0 ends. */
    TD_CHECK_OK(td_device_empty_cache());
    gen_init(&g0, dev(0), 3);
    gen_init(&g1, dev(1), 4);
    uint64_t rng = 12345;
    end0 = end1 = false;
    while (!(end0 && end1)) {
        if (!end0)
            end0 = !gen_next(&g0);
        int times = end0 ? 1 << 30 : (int)(gen_random(&rng) % 3);
        for (int t = 0; t < times && !end1; t++)
            end1 = !gen_next(&g1);
    }
    for (int i = 0; i < 2; i++) {
        TD_CHECK_EQ(td_memory_allocated(dev(i)), 0);
        TD_CHECK_EQ(td_memory_reserved(dev(i)), 0);
    }
    dev_teardown();
}

TD_TEST(test_cuda_device_memory_allocated, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 2);
    int count = td_device_count(type);
    int64_t before[MAX_DEVS];
    for (int i = 0; i < count && i < MAX_DEVS; i++)
        before[i] = td_memory_allocated(dev(i));
    void *x = dmalloc(dev(0), 10 * sizeof(float), NULL); /* torch.ones(10, device="cuda:0") */
    TD_CHECK(td_memory_allocated(dev(0)) > before[0]);
    TD_CHECK_EQ(td_memory_allocated(dev(0)), before[0] + 512);
    for (int i = 1; i < count && i < MAX_DEVS; i++)
        TD_CHECK_EQ(td_memory_allocated(dev(i)), before[i]);
    /* index -1 is the current device: device 1 inside a guard. */
    td_device_guard guard;
    TD_CHECK_OK(td_device_guard_enter(&guard, dev(1)));
    td_device current = {type, -1};
    TD_CHECK_EQ(td_memory_allocated(current), before[1]);
    td_device_guard_exit(&guard);
    TD_CHECK_EQ(td_memory_allocated(current), before[0] + 512);
    td_device_free(x);
    TD_CHECK_EQ(td_memory_allocated(dev(0)), before[0]);
    dev_teardown();
}

/* test_cuda_device_memory_allocated on device 0 alone: an allocation counts there, also asked for
 * as the current device, until it is freed; bad devices give -1 with the runtime's message. */
TD_TEST(test_device_memory_allocated_one_device, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    int count = td_device_count(type);
    td_device current = {type, -1};
    int64_t before = td_memory_allocated(dev(0));
    TD_CHECK_EQ(td_memory_allocated(current), before);
    void *x = dmalloc(dev(0), 10 * sizeof(float), NULL);
    TD_CHECK_EQ(td_memory_allocated(dev(0)), before + 512);
    TD_CHECK_EQ(td_memory_allocated(current), before + 512);
    td_device_free(x);
    TD_CHECK_EQ(td_memory_allocated(dev(0)), before);
    td_device cpu = {TD_DEVICE_CPU, -1};
    TD_CHECK_EQ(td_memory_allocated(cpu), -1);
    TD_CHECK_CONTAINS(td_last_error(), "Expected a");
    TD_CHECK_EQ(td_memory_allocated(dev(count)), -1);
    TD_CHECK_CONTAINS(td_last_error(), "Invalid device ordinal");
    dev_teardown();
}

static void mem_get_info_on(td_device d)
{
    TD_CHECK_OK(td_device_empty_cache());
    TD_CHECK_OK(td_device_synchronize(d));
    size_t free_before = 0, total_before = 0, free_after = 0, total_after = 0;
    TD_CHECK_OK(td_device_mem_get_info(d, &free_before, &total_before));
    void *p = dmalloc(d, 1024 * 1024 * 8 * sizeof(float), NULL); /* randn(1024*1024*8): 32 MiB */
    TD_CHECK_OK(td_device_mem_get_info(d, &free_after, &total_after));
    TD_CHECK_MSG(free_after < free_before, "free %zu did not drop below %zu", free_after, free_before);
    TD_CHECK_EQ(total_after, total_before);
    td_device_free(p);
    TD_CHECK_OK(td_device_empty_cache());
}

TD_TEST(test_mem_get_info, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    mem_get_info_on(dev(0));
    td_device current = {type, -1};
    mem_get_info_on(current);
    if (td_device_count(type) >= 2)
        mem_get_info_on(dev(1));
    dev_teardown();
}

/* ---- the leak checker of common_utils.CudaMemoryLeakCheck (spec 2.7) --------------------------- */

typedef struct leak_check {
    const char *name;
    td_device_type type;
    int count;
    int64_t allocated[MAX_DEVS];
    int64_t driver[MAX_DEVS]; /* total - free */
} leak_check;

static int64_t driver_used(td_device d)
{
    size_t free_bytes = 0, total = 0;
    TD_CHECK_OK(td_device_mem_get_info(d, &free_bytes, &total));
    return (int64_t)(total - free_bytes);
}

static void leak_enter(leak_check *lc, const char *name, td_device_type type)
{
    lc->name = name;
    lc->type = type;
    lc->count = td_device_count(type);
    TD_CHECK_OK(td_device_empty_cache());
    for (int i = 0; i < lc->count && i < MAX_DEVS; i++) {
        td_device d = {type, i};
        lc->allocated[i] = td_memory_allocated(d);
        lc->driver[i] = driver_used(d);
    }
}

/* NULL when nothing leaked; else the RuntimeError's message (caller frees). A growth the driver does
 * not confirm is a warning only, printed to stderr. */
static char *leak_exit(leak_check *lc)
{
    bool grew = false;
    for (int attempt = 0; attempt < 3; attempt++) {
        TD_CHECK_OK(td_device_empty_cache());
        grew = false;
        for (int i = 0; i < lc->count && i < MAX_DEVS; i++)
            grew |= td_memory_allocated((td_device){lc->type, i}) > lc->allocated[i];
        if (!grew)
            return NULL;
    }
    for (int i = 0; i < lc->count && i < MAX_DEVS; i++) {
        td_device d = {lc->type, i};
        int64_t after = td_memory_allocated(d);
        if (after <= lc->allocated[i])
            continue;
        int64_t driver_after = driver_used(d);
        if (driver_after > lc->driver[i]) {
            char *msg = malloc(512);
            TD_CHECK(msg != NULL);
            snprintf(msg, 512,
                     "CUDA driver API confirmed a leak in %s! Caching allocator allocated memory was %lld and is now "
                     "reported as %lld on device %d. CUDA driver allocated memory was %lld and is now %lld.",
                     lc->name, (long long)lc->allocated[i], (long long)after, i, (long long)lc->driver[i],
                     (long long)driver_after);
            return msg;
        }
        fprintf(stderr, "CUDA caching allocator reports a memory leak not verified by the driver API in %s!\n",
                lc->name);
    }
    return NULL;
}

static void *leaked[2];

static void leak_gpu0(void) { leaked[0] = dmalloc(dev(0), 32 * MIB, NULL); }
static void leak_gpu1(void) { leaked[1] = dmalloc(dev(1), 32 * MIB, NULL); }
static void no_leak(void)
{
    /* Memory freed inside the body stays cached: the driver sees it, the allocator does not. */
    void *p = dmalloc(dev(0), 32 * MIB, NULL);
    td_device_free(p);
}

TD_TEST(test_cuda_memory_leak_detection, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    leak_check lc;
    leak_enter(&lc, "no_leak", type);
    no_leak();
    char *msg = leak_exit(&lc);
    TD_CHECK_MSG(msg == NULL, "false alarm: %s", msg ? msg : "");

    leak_enter(&lc, "leak_gpu0", type);
    leak_gpu0();
    msg = leak_exit(&lc);
    TD_CHECK(msg != NULL);
    TD_CHECK_CONTAINS(msg, "CUDA driver API confirmed a leak in leak_gpu0! Caching allocator allocated memory was 0 "
                           "and is now reported as 33554432 on device 0. CUDA driver allocated memory was ");
    free(msg);
    td_device_free(leaked[0]);

    if (td_device_count(type) >= 2) {
        leak_enter(&lc, "leak_gpu1", type);
        leak_gpu1();
        msg = leak_exit(&lc);
        TD_CHECK(msg != NULL);
        TD_CHECK_CONTAINS(msg, "CUDA driver API confirmed a leak in leak_gpu1!");
        TD_CHECK_CONTAINS(msg, " on device 1. CUDA driver allocated memory was ");
        free(msg);
        td_device_free(leaked[1]);
    }
    TD_CHECK_OK(td_device_empty_cache());
    dev_teardown();
}

/* ---- pinned host memory (spec 6) --------------------------------------------------------------- */

static void copy_async(td_stream *s, void *dst, const void *src, size_t n, device_copy_kind kind)
{
    const device_impl *impl = device_impl_of(td_stream_device(s).type);
    TD_CHECK_OK(impl->memcpy_async(td_stream_device(s).index, dst, src, n, kind, td_stream_native(s)));
}

static float read_device_float(td_device d, void *src)
{
    float v = -1;
    td_stream *s = NULL;
    TD_CHECK_OK(td_stream_current(d, &s));
    copy_async(s, &v, src, sizeof v, DEVICE_COPY_D2H);
    TD_CHECK_OK(td_stream_synchronize(s));
    return v;
}

TD_TEST(test_caching_pinned_memory_multi_gpu, DEV_CASE)
{
    dev_setup(ctx, 2);
    float *t = NULL;
    TD_CHECK_OK(td_host_alloc(sizeof(float), (void **)&t));
    TD_CHECK(td_host_is_pinned(t));
    *t = 1;
    void *ptr = t;
    void *gpu0 = dmalloc(dev(0), sizeof(float), NULL);
    void *gpu1 = dmalloc(dev(1), sizeof(float), NULL);
    td_stream *s0 = NULL, *s1 = NULL;
    TD_CHECK_OK(td_stream_current(dev(0), &s0));
    TD_CHECK_OK(td_stream_current(dev(1), &s1));

    /* with device(1): a slow stream, then the copy from the pinned block; the event goes on s1. */
    stream_sleep_ms(s1, 300);
    copy_async(s1, gpu1, t, sizeof(float), DEVICE_COPY_H2D);
    TD_CHECK_OK(td_host_record_stream(t, s1));
    td_host_free(t);

    float *t2 = NULL;
    TD_CHECK_OK(td_host_alloc(sizeof(float), (void **)&t2));
    TD_CHECK_MSG((void *)t2 != ptr, "allocation reused too soon");
    *t2 = 2;
    copy_async(s0, gpu0, t2, sizeof(float), DEVICE_COPY_H2D);
    TD_CHECK_OK(td_host_record_stream(t2, s0));

    TD_CHECK_EQ(read_device_float(dev(1), gpu1), 1);
    TD_CHECK_EQ(read_device_float(dev(0), gpu0), 2);
    /* Once s1's work is done the first block is handed out again (t2 is still held). */
    TD_CHECK_OK(td_stream_synchronize(s1));
    void *t3 = NULL;
    TD_CHECK_OK(td_host_alloc(3, &t3));
    TD_CHECK(t3 == ptr);
    td_host_free(t3);
    td_host_free(t2);
    TD_CHECK(!td_host_is_pinned(t2));
    td_device_free(gpu0);
    td_device_free(gpu1);
    TD_CHECK_OK(td_host_empty_cache());
    TD_CHECK_OK(td_device_empty_cache());
    dev_teardown();
}

/* ---- the allocator's own rules ------------------------------------------------------------------ */

static td_memory_segment *segment_at(td_memory_snapshot *snap, td_device d, void *base)
{
    for (size_t i = 0; i < snap->segment_count; i++)
        if (snap->segments[i].device.index == d.index && snap->segments[i].address == (uint64_t)(uintptr_t)base)
            return &snap->segments[i];
    TD_FAIL("no segment at %p", base);
}

static void check_block(const td_memory_segment *seg, size_t i, uint64_t size, uint64_t requested,
                        td_memory_block_state state)
{
    TD_CHECK_MSG(i < seg->block_count, "segment has %zu blocks, wanted block %zu", seg->block_count, i);
    TD_CHECK_EQ(seg->blocks[i].size, size);
    TD_CHECK_EQ(seg->blocks[i].requested_size, requested);
    TD_CHECK_EQ(seg->blocks[i].state, state);
}

TD_TEST(test_caching_allocator_rounding_and_split, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    td_device d = dev(0);
    td_stream *s = NULL;
    TD_CHECK_OK(td_stream_create(d, 0, &s));
    const uint64_t small_seg = 2 * MIB;

    void *a = dmalloc(d, 1, s); /* 512 bytes of a 2 MiB small segment */
    void *b = dmalloc(d, MIB, s); /* <= 1 MiB: small pool, split from a's segment */
    TD_CHECK((char *)b == (char *)a + 512);
    void *c = dmalloc(d, 12 * MIB + 1, s); /* large: 12 MiB + 512 in a 14 MiB segment, 2 MiB - 512 left */
    void *e = dmalloc(d, 2 * MIB, s); /* does not fit the remainder: a new 20 MiB segment */
    void *f = dmalloc(d, MIB + 512, s); /* takes the remainder whole: 1 MiB - 512 left is not > 1 MiB */
    TD_CHECK((char *)f == (char *)c + 12 * MIB + 512);
    check_consistency(type);

    td_memory_snapshot snap;
    TD_CHECK_OK(td_memory_snapshot_get(type, &snap));
    TD_CHECK_EQ(snap.segment_count, 3);
    td_memory_segment *sa = segment_at(&snap, d, a);
    TD_CHECK(!sa->is_large);
    TD_CHECK_EQ(sa->total_size, small_seg);
    TD_CHECK_EQ(sa->stream_id, td_stream_id(s));
    TD_CHECK_EQ(sa->block_count, 3);
    check_block(sa, 0, 512, 1, TD_BLOCK_ACTIVE_ALLOCATED);
    check_block(sa, 1, MIB, MIB, TD_BLOCK_ACTIVE_ALLOCATED);
    check_block(sa, 2, small_seg - 512 - MIB, 0, TD_BLOCK_INACTIVE);
    TD_CHECK_EQ(sa->allocated_size, 512 + MIB);
    TD_CHECK_EQ(sa->requested_size, 1 + MIB);
    td_memory_segment *sc = segment_at(&snap, d, c);
    TD_CHECK(sc->is_large);
    TD_CHECK_EQ(sc->total_size, 14 * MIB);
    TD_CHECK_EQ(sc->block_count, 2);
    check_block(sc, 0, 12 * MIB + 512, 12 * MIB + 1, TD_BLOCK_ACTIVE_ALLOCATED);
    check_block(sc, 1, 2 * MIB - 512, MIB + 512, TD_BLOCK_ACTIVE_ALLOCATED);
    td_memory_segment *se = segment_at(&snap, d, e);
    TD_CHECK_EQ(se->total_size, 20 * MIB);
    TD_CHECK_EQ(se->block_count, 2);
    check_block(se, 1, 18 * MIB, 0, TD_BLOCK_INACTIVE);
    td_memory_snapshot_free(&snap);
    /* memory_allocated counts rounded blocks; requested_bytes the callers' bytes. */
    TD_CHECK_EQ(td_memory_allocated(d), 512 + MIB + 14 * MIB + 2 * MIB);
    TD_CHECK_EQ(stat_of(d, "requested_bytes.all.current"), 1 + MIB + 12 * MIB + 1 + 2 * MIB + MIB + 512);
    TD_CHECK_EQ(stat_of(d, "inactive_split.small_pool.current"), 1);
    TD_CHECK_EQ(stat_of(d, "inactive_split.large_pool.current"), 1);
    TD_CHECK_EQ(stat_of(d, "segment.large_pool.current"), 2);

    /* Freeing b merges it with the free tail; freeing a makes the segment whole again. */
    td_device_free(b);
    check_consistency(type);
    TD_CHECK_OK(td_memory_snapshot_get(type, &snap));
    sa = segment_at(&snap, d, a);
    TD_CHECK_EQ(sa->block_count, 2);
    check_block(sa, 1, small_seg - 512, 0, TD_BLOCK_INACTIVE);
    td_memory_snapshot_free(&snap);
    td_device_free(a);
    check_consistency(type);
    TD_CHECK_OK(td_memory_snapshot_get(type, &snap));
    sa = segment_at(&snap, d, a);
    TD_CHECK_EQ(sa->block_count, 1);
    check_block(sa, 0, small_seg, 0, TD_BLOCK_INACTIVE);
    td_memory_snapshot_free(&snap);
    TD_CHECK_EQ(stat_of(d, "inactive_split.small_pool.current"), 0);

    /* empty_cache releases only the wholly free segment. */
    int64_t reserved = td_memory_reserved(d);
    TD_CHECK_OK(td_device_empty_cache());
    TD_CHECK_EQ(td_memory_reserved(d), reserved - (int64_t)small_seg);
    check_consistency(type);
    td_device_free(c);
    td_device_free(f);
    td_device_free(e);
    check_consistency(type);
    TD_CHECK_OK(td_device_empty_cache());
    TD_CHECK_EQ(td_memory_reserved(d), 0);
    TD_CHECK_OK(td_memory_snapshot_get(type, &snap));
    TD_CHECK_EQ(snap.segment_count, 0);
    td_memory_snapshot_free(&snap);

    /* Zero bytes: NULL, and no statistic moves. */
    td_memory_stats before, after;
    TD_CHECK_OK(td_memory_stats_get(d, &before));
    void *z = (void *)1;
    TD_CHECK_OK(td_device_malloc(d, 0, s, &z));
    TD_CHECK(z == NULL);
    td_device_free(z);
    TD_CHECK_OK(td_memory_stats_get(d, &after));
    TD_CHECK(memcmp(&before, &after, sizeof before) == 0);
    td_stream_release(s);
    dev_teardown();
}

TD_TEST(test_memory_stats_keys, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_memory_stats stats;
    TD_CHECK_OK(td_memory_stats_get(dev(0), &stats));
    int n = 0, currents = 0;
    for (; td_memory_stats_key(n); n++) {
        const char *key = td_memory_stats_key(n);
        if (n > 0)
            TD_CHECK_MSG(strcmp(td_memory_stats_key(n - 1), key) < 0, "keys out of order at %s", key);
        int64_t v = 0;
        TD_CHECK_OK(td_memory_stats_lookup(&stats, key, &v));
        size_t len = strlen(key);
        if (len > 8 && strcmp(key + len - 8, ".current") == 0 && strncmp(key, "oversize", 8) != 0)
            currents++;
    }
    TD_CHECK_EQ(n, 9 * 3 * 4 + 2 * 4 + 6);
    TD_CHECK_EQ(currents, 27);
    int64_t v = 0;
    TD_CHECK_OK(td_memory_stats_lookup(&stats, "max_split_size", &v));
    TD_CHECK_EQ(v, -1);
    void *p = dmalloc(dev(0), 3000, NULL);
    TD_CHECK_OK(td_memory_stats_get(dev(0), &stats));
    TD_CHECK_OK(td_memory_stats_lookup(&stats, "allocated_bytes.small_pool.current", &v));
    TD_CHECK_EQ(v, 3072);
    TD_CHECK_OK(td_memory_stats_lookup(&stats, "requested_bytes.all.allocated", &v));
    TD_CHECK_EQ(v, 3000);
    TD_CHECK_OK(td_memory_stats_lookup(&stats, "segment.small_pool.peak", &v));
    TD_CHECK_EQ(v, 1);
    TD_CHECK_OK(td_memory_stats_lookup(&stats, "num_device_alloc", &v));
    TD_CHECK_EQ(v, 1);
    TD_CHECK_ERR(td_memory_stats_lookup(&stats, "allocated_bytes.tiny_pool.current", &v), TD_ERR_NOT_FOUND,
                 "allocated_bytes.tiny_pool.current");
    td_device_free(p);
    TD_CHECK_OK(td_memory_stats_get(dev(0), &stats));
    TD_CHECK_OK(td_memory_stats_lookup(&stats, "allocated_bytes.all.freed", &v));
    TD_CHECK_EQ(v, 3072);
    TD_CHECK_OK(td_device_empty_cache());
    TD_CHECK_EQ(stat_of(dev(0), "num_device_free"), 1);
    dev_teardown();
}

TD_TEST(test_caching_allocator_stream_ordered_reuse, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    td_device d = dev(0);
    td_stream *s1 = NULL, *s2 = NULL;
    TD_CHECK_OK(td_stream_create(d, 0, &s1));
    TD_CHECK_OK(td_stream_create(d, 0, &s2));
    void *p = dmalloc(d, 1000, s1);
    td_device_free(p);
    /* The same stream reuses the block at once. */
    void *q = dmalloc(d, 1000, s1);
    TD_CHECK(q == p);
    td_device_free(q);
    /* Another stream does not: its own pool, a segment of its own. */
    void *r = dmalloc(d, 1000, s2);
    TD_CHECK(r != p);
    TD_CHECK_EQ(stat_of(d, "segment.small_pool.current"), 2);
    td_memory_snapshot snap;
    TD_CHECK_OK(td_memory_snapshot_get(type, &snap));
    TD_CHECK_EQ(segment_at(&snap, d, p)->stream_id, td_stream_id(s1));
    TD_CHECK_EQ(segment_at(&snap, d, r)->stream_id, td_stream_id(s2));
    td_memory_snapshot_free(&snap);
    /* NULL stream: the current stream of the device, set by a stream guard. */
    td_stream_guard sg;
    TD_CHECK_OK(td_stream_guard_enter(&sg, s1));
    void *u = dmalloc(d, 1000, NULL);
    td_stream_guard_exit(&sg);
    TD_CHECK(u == p);
    /* A stream of another device is refused. */
    if (td_device_count(type) >= 2) {
        void *x = (void *)1;
        TD_CHECK_ERR(td_device_malloc(dev(1), 16, s1, &x), TD_ERR_INVALID, NULL);
        TD_CHECK(x == NULL);
    }
    td_device_free(u);
    td_device_free(r);
    check_consistency(type);
    td_stream_release(s1);
    td_stream_release(s2);
    TD_CHECK_OK(td_device_empty_cache());
    dev_teardown();
}

TD_TEST(test_caching_allocator_record_stream, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    td_device d = dev(0);
    td_stream *alloc_stream = NULL, *user = NULL;
    TD_CHECK_OK(td_stream_current(d, &alloc_stream));
    TD_CHECK_OK(td_stream_create(d, 0, &user));
    void *p = dmalloc(d, 4096, NULL);
    stream_sleep_ms(user, 300);
    TD_CHECK_OK(td_device_record_stream(p, user));
    TD_CHECK_OK(td_device_record_stream(p, user)); /* twice: one event */
    TD_CHECK_OK(td_device_record_stream(p, alloc_stream)); /* its own stream: nothing to wait for */
    td_device_free(p);

    /* Pending: not allocated any more, still active, and not handed out again. */
    TD_CHECK_EQ(td_memory_allocated(d), 0);
    TD_CHECK_EQ(stat_of(d, "active_bytes.all.current"), 4096);
    TD_CHECK_EQ(stat_of(d, "active.small_pool.current"), 1);
    check_consistency(type);
    td_memory_snapshot snap;
    TD_CHECK_OK(td_memory_snapshot_get(type, &snap));
    td_memory_segment *seg = segment_at(&snap, d, p);
    check_block(seg, 0, 4096, 4096, TD_BLOCK_ACTIVE_PENDING_FREE);
    TD_CHECK_EQ(seg->active_size, 4096);
    TD_CHECK_EQ(seg->allocated_size, 0);
    td_memory_snapshot_free(&snap);
    void *q = dmalloc(d, 4096, NULL);
    TD_CHECK(q != p);
    check_consistency(type);
    td_stream_release(user); /* the pending block does not need the handle any more */

    /* empty_cache waits for the recorded work (with no lock held), then the block is free again. */
    TD_CHECK_OK(td_device_empty_cache());
    TD_CHECK_EQ(stat_of(d, "active.all.current"), 1);
    void *r = dmalloc(d, 4096, NULL);
    TD_CHECK(r == p);
    check_consistency(type);

    /* Recording a stream of another device (the cross-device case). */
    if (td_device_count(type) >= 2) {
        td_stream *other = NULL;
        TD_CHECK_OK(td_stream_create(dev(1), 0, &other));
        stream_sleep_ms(other, 200);
        TD_CHECK_OK(td_device_record_stream(r, other));
        td_device_free(r);
        void *x = dmalloc(d, 4096, NULL);
        TD_CHECK(x != r);
        TD_CHECK_OK(td_stream_synchronize(other));
        void *y = dmalloc(d, 4096, NULL); /* the poll at malloc finds the event done */
        TD_CHECK(y == r);
        td_device_free(x);
        r = y;
        td_stream_release(other);
    }
    TD_CHECK_ERR(td_device_record_stream((char *)q + 1, alloc_stream), TD_ERR_INVALID, "td_device_malloc");
    td_device_free(q);
    td_device_free(r);
    check_consistency(type);
    TD_CHECK_OK(td_device_empty_cache());
    TD_CHECK_EQ(td_memory_reserved(d), 0);
    dev_teardown();
}

static const char *oom_static_skip(const char *param)
{
    return strncmp(param, "sim", 3) == 0 ? NULL : "the OOM case runs on simulated devices with a small budget";
}

TD_TEST(test_caching_allocator_oom, DEV_CASE, .static_skip = oom_static_skip)
{
    setenv("TDIST_SIM_MEMORY", "64M", 1);
    td_device_type type = dev_setup(ctx, 1);
    td_device d = dev(0);
    td_stream *other = NULL;
    TD_CHECK_OK(td_stream_create(d, 0, &other));
    void *a = dmalloc(d, 30 * MIB, NULL);
    td_device_free(a); /* cached: 30 MiB reserved */
    TD_CHECK_EQ(td_memory_reserved(d), 30 * MIB);
    /* Another stream's pool cannot use it: the first device malloc fails, the cache is released and
     * the retry succeeds. */
    void *b = dmalloc(d, 50 * MIB, other);
    TD_CHECK_EQ(stat_of(d, "num_alloc_retries"), 1);
    TD_CHECK_EQ(stat_of(d, "num_ooms"), 0);
    TD_CHECK_EQ(td_memory_reserved(d), 50 * MIB);
    TD_CHECK_EQ(stat_of(d, "num_device_free"), 1);
    /* Nothing left to release: out of memory. */
    void *c = (void *)1;
    TD_CHECK_ERR(td_device_malloc(d, 40 * MIB, NULL, &c), TD_ERR_NOMEM,
                 "CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total capacity of 64.00 MiB");
    TD_CHECK_CONTAINS(td_last_error(),
                      "Of the allocated memory 50.00 MiB is allocated by tdist, and 0 bytes is reserved");
    TD_CHECK_CONTAINS(td_last_error(), "(Simulated device sim:0 out of memory.");
    TD_CHECK(c == NULL);
    TD_CHECK_EQ(stat_of(d, "num_ooms"), 1);
    TD_CHECK_EQ(stat_of(d, "num_alloc_retries"), 2);
    TD_CHECK_EQ(td_memory_allocated(d), 50 * MIB);
    check_consistency(type);
    td_device_free(b);
    /* After freeing, the same request fits (through one more release of the cache). */
    c = dmalloc(d, 40 * MIB, NULL);
    TD_CHECK(c != NULL);
    td_device_free(c);
    td_stream_release(other);
    TD_CHECK_OK(td_device_empty_cache());
    dev_teardown();
}

TD_TEST(test_pinned_memory_cache, DEV_CASE)
{
    dev_setup(ctx, 1);
    void *p = NULL, *q = NULL;
    TD_CHECK_OK(td_host_alloc(100, &p));
    TD_CHECK(td_host_is_pinned(p));
    TD_CHECK(td_host_is_pinned((char *)p + 127)); /* the block is 128 bytes */
    TD_CHECK(!td_host_is_pinned(&q));
    void *z = (void *)1;
    TD_CHECK_OK(td_host_alloc(0, &z));
    TD_CHECK(z == NULL);
    td_host_free(p);
    TD_CHECK(!td_host_is_pinned(p));
    /* Cached by size: a request that rounds to the same power of two gets the block back. */
    TD_CHECK_OK(td_host_alloc(128, &q));
    TD_CHECK(q == p);
    /* A slow stream's event holds the block back until the work is done. */
    td_stream *s = NULL;
    TD_CHECK_OK(td_stream_create(dev(0), 0, &s));
    stream_sleep_ms(s, 200);
    TD_CHECK_OK(td_host_record_stream((char *)q + 8, s));
    td_host_free(q);
    td_device_live live;
    td_device_live_get(&live);
    TD_CHECK_EQ(live.host_blocks, 0);
    void *r = NULL;
    TD_CHECK_OK(td_host_alloc(65, &r));
    TD_CHECK(r != p);
    TD_CHECK_OK(td_stream_synchronize(s));
    void *t = NULL;
    TD_CHECK_OK(td_host_alloc(128, &t));
    TD_CHECK(t == p);
    td_device_live_get(&live);
    TD_CHECK_EQ(live.host_blocks, 2);
    TD_CHECK_ERR(td_host_record_stream(&live, s), TD_ERR_INVALID, NULL);
    td_host_free(t);
    td_host_free(r);
    td_stream_release(s);
    TD_CHECK_OK(td_host_empty_cache());
    dev_teardown();
}

/* Threads allocating and freeing on two devices at once; stats and snapshots stay consistent. */
typedef struct churn_arg {
    td_device device;
    uint64_t seed;
} churn_arg;

static void *churn(void *argp)
{
    churn_arg *arg = argp;
    void *held[16] = {0};
    for (int i = 0; i < 400; i++) {
        int slot = (int)(gen_random(&arg->seed) % 16);
        if (held[slot]) {
            td_device_free(held[slot]);
            held[slot] = NULL;
        } else {
            size_t n = (size_t)(gen_random(&arg->seed) % (3 * MIB)) + 1;
            if (td_device_malloc(arg->device, n, NULL, &held[slot]) != TD_OK)
                return (void *)1;
        }
    }
    for (int i = 0; i < 16; i++)
        td_device_free(held[i]);
    return NULL;
}

TD_TEST(test_caching_allocator_threads, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    int ndev = td_device_count(type) >= 2 ? 2 : 1;
    pthread_t threads[4];
    churn_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i].device = dev(i % ndev);
        args[i].seed = (uint64_t)i * 7919 + 1;
        TD_CHECK_EQ(pthread_create(&threads[i], NULL, churn, &args[i]), 0);
    }
    /* While they run, every snapshot is whole: each segment's blocks tile it and its sums add up
     * (stats and snapshot are two calls, so comparing them waits until the threads are done). */
    for (int round = 0; round < 20; round++) {
        td_memory_snapshot snap;
        TD_CHECK_OK(td_memory_snapshot_get(type, &snap));
        for (size_t i = 0; i < snap.segment_count; i++) {
            const td_memory_segment *seg = &snap.segments[i];
            uint64_t total = 0, allocated = 0, requested = 0, next = seg->address;
            for (size_t b = 0; b < seg->block_count; b++) {
                TD_CHECK_EQ(seg->blocks[b].address, next);
                next += seg->blocks[b].size;
                total += seg->blocks[b].size;
                if (seg->blocks[b].state == TD_BLOCK_ACTIVE_ALLOCATED) {
                    allocated += seg->blocks[b].size;
                    requested += seg->blocks[b].requested_size;
                }
            }
            TD_CHECK_EQ(total, seg->total_size);
            TD_CHECK_EQ(allocated, seg->allocated_size);
            TD_CHECK_EQ(requested, seg->requested_size);
        }
        td_memory_snapshot_free(&snap);
    }
    for (int i = 0; i < 4; i++) {
        void *rc = NULL;
        pthread_join(threads[i], &rc);
        TD_CHECK(rc == NULL);
    }
    check_consistency(type);
    for (int i = 0; i < ndev; i++)
        TD_CHECK_EQ(td_memory_allocated(dev(i)), 0);
    TD_CHECK_OK(td_device_empty_cache());
    for (int i = 0; i < ndev; i++)
        TD_CHECK_EQ(td_memory_reserved(dev(i)), 0);
    dev_teardown();
}

TD_TEST_MAIN()
