/* The host-simulated device implementation (src/device/sim.c) through its device_impl table, below
 * the front end: FIFO order of a stream's work items, sleep/query/synchronize, events reached when
 * their stream gets to them (across devices too), timing, the memory budget and its OOM message,
 * strided copies, default streams of two devices running at once, and stream destruction draining
 * the queue. Sim device memory is host memory, so the bodies read results directly. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/device.h>
#include <tdist/testing.h>

#include "base/clock.h"
#include "device/device_impl.h"

static const device_impl *sim_begin(void)
{
    setenv("TDIST_SIM_DEVICES", "2", 1);
    const device_impl *impl = &device_sim_impl;
    TD_CHECK_EQ(impl->count(), 2);
    return impl;
}

static void sim_end(void)
{
    device_sim_impl.shutdown();
    TD_CHECK_EQ(device_sim_thread_count(), 0);
}

static float *dev_floats(const device_impl *impl, int dev, size_t n)
{
    void *p = NULL;
    TD_CHECK_OK(impl->device_malloc(dev, n * sizeof(float), &p));
    TD_CHECK(p != NULL);
    TD_CHECK_EQ((uintptr_t)p % 256, 0);
    return p;
}

/* 1 ms = 1e6 cycles at the sim clock of 1 GHz. */
static int64_t ms_cycles(int64_t ms) { return ms * 1000000; }

TD_TEST(fifo_order_on_one_stream)
{
    const device_impl *impl = sim_begin();
    enum { N = 1024 };
    void *s = NULL;
    TD_CHECK_OK(impl->stream_create(0, 0, &s));
    float *a = dev_floats(impl, 0, N), *b = dev_floats(impl, 0, N), *sum = dev_floats(impl, 0, N);
    float host[N];
    memset(host, 0, sizeof host);
    float one = 1.0f, five = 5.0f;

    /* The sleep holds the thread so that everything below is queued before any of it runs: only
     * FIFO order gives a = 5, b = 1, sum = 6 (fill after copy, add after the second fill). */
    TD_CHECK_OK(impl->sleep(0, ms_cycles(20), s));
    TD_CHECK_OK(impl->fill(0, a, N, &one, sizeof one, s));
    TD_CHECK_OK(impl->memcpy_async(0, b, a, N * sizeof(float), DEVICE_COPY_D2D, s));
    TD_CHECK_OK(impl->fill(0, a, N, &five, sizeof five, s));
    TD_CHECK_OK(impl->add(0, sum, a, b, N, TD_FLOAT32, s));
    TD_CHECK_OK(impl->memcpy_async(0, host, sum, N * sizeof(float), DEVICE_COPY_D2H, s));
    TD_CHECK_EQ(impl->stream_query(0, s), 0);
    TD_CHECK_OK(impl->stream_synchronize(0, s));
    TD_CHECK_EQ(impl->stream_query(0, s), 1);
    for (int i = 0; i < N; i++) {
        TD_CHECK_NEAR(host[i], 6.0, 0);
        TD_CHECK_NEAR(b[i], 1.0, 0);
    }
    /* No kernel for a bad dtype: refused at once. */
    TD_CHECK_ERR(impl->add(0, sum, a, b, N, (td_dtype)99, s), TD_ERR_UNSUPPORTED, NULL);

    impl->device_free(0, a);
    impl->device_free(0, b);
    impl->device_free(0, sum);
    impl->stream_destroy(0, s);
    sim_end();
}

TD_TEST(sleep_then_query_synchronize)
{
    const device_impl *impl = sim_begin();
    TD_CHECK_EQ(impl->stream_query(0, NULL), 1);
    int64_t t0 = clock_now_ns();
    TD_CHECK_OK(impl->sleep(0, ms_cycles(50), NULL));
    TD_CHECK_EQ(impl->stream_query(0, NULL), 0);
    TD_CHECK_OK(impl->stream_synchronize(0, NULL));
    int64_t waited_ms = (clock_now_ns() - t0) / 1000000;
    TD_CHECK_MSG(waited_ms >= 45, "synchronize returned after %lld ms of a 50 ms sleep", (long long)waited_ms);
    TD_CHECK_EQ(impl->stream_query(0, NULL), 1);
    /* Device 1's default stream was never used: no thread for it. */
    TD_CHECK_EQ(device_sim_thread_count(), 1);
    sim_end();
}

TD_TEST(event_query_around_sleep)
{
    const device_impl *impl = sim_begin();
    void *e = NULL;
    TD_CHECK_OK(impl->event_create(0, TD_EVENT_DEFAULT, &e));
    TD_CHECK_EQ(impl->event_query(0, e), 1); /* never recorded */
    TD_CHECK_OK(impl->sleep(0, ms_cycles(50), NULL));
    TD_CHECK_OK(impl->event_record(0, e, NULL));
    TD_CHECK_EQ(impl->event_query(0, e), 0);
    TD_CHECK_OK(impl->event_synchronize(0, e));
    TD_CHECK_EQ(impl->event_query(0, e), 1);
    TD_CHECK_EQ(impl->stream_query(0, NULL), 1);

    /* Re-recording replaces the capture: pending again behind a new sleep. */
    TD_CHECK_OK(impl->sleep(0, ms_cycles(30), NULL));
    TD_CHECK_OK(impl->event_record(0, e, NULL));
    TD_CHECK_EQ(impl->event_query(0, e), 0);
    TD_CHECK_OK(impl->event_synchronize(0, e));
    TD_CHECK_EQ(impl->event_query(0, e), 1);

    td_event_ipc_handle handle;
    /* Only interprocess events have a handle (test_device_ipc.c shares those). */
    TD_CHECK_ERR(impl->event_ipc_handle(0, e, &handle), TD_ERR_INVALID, "not created with TD_EVENT_INTERPROCESS");
    impl->event_destroy(0, e);
    sim_end();
}

TD_TEST(cross_device_wait_event)
{
    const device_impl *impl = sim_begin();
    enum { N = 256 };
    void *s0 = NULL, *s1 = NULL, *e = NULL, *e1 = NULL;
    TD_CHECK_OK(impl->stream_create(0, 0, &s0));
    TD_CHECK_OK(impl->stream_create(1, -1, &s1));
    TD_CHECK_OK(impl->event_create(0, TD_EVENT_DEFAULT, &e));
    TD_CHECK_OK(impl->event_create(1, TD_EVENT_DEFAULT, &e1));
    float *x = dev_floats(impl, 0, N), *y = dev_floats(impl, 1, N);
    float zero = 0.0f, seven = 7.0f;
    TD_CHECK_OK(impl->fill(1, y, N, &zero, sizeof zero, s1));
    TD_CHECK_OK(impl->stream_synchronize(1, s1));

    int64_t t0 = clock_now_ns();
    TD_CHECK_OK(impl->sleep(0, ms_cycles(100), s0));
    TD_CHECK_OK(impl->fill(0, x, N, &seven, sizeof seven, s0));
    TD_CHECK_OK(impl->event_record(0, e, s0));
    /* Device 1's stream waits for device 0's event, then copies x (device 0) into y. */
    TD_CHECK_OK(impl->stream_wait_event(1, s1, e));
    TD_CHECK_OK(impl->memcpy_async(1, y, x, N * sizeof(float), DEVICE_COPY_D2D, s1));
    TD_CHECK_OK(impl->event_record(1, e1, s1));
    TD_CHECK_EQ(impl->event_query(1, e1), 0);
    TD_CHECK_EQ(impl->stream_query(1, s1), 0);

    TD_CHECK_OK(impl->stream_synchronize(1, s1));
    int64_t waited_ms = (clock_now_ns() - t0) / 1000000;
    TD_CHECK_MSG(waited_ms >= 90, "device 1's stream finished after %lld ms, before device 0's 100 ms sleep",
                 (long long)waited_ms);
    TD_CHECK_EQ(impl->event_query(0, e), 1);
    TD_CHECK_EQ(impl->event_query(1, e1), 1);
    for (int i = 0; i < N; i++)
        TD_CHECK_NEAR(y[i], 7.0, 0);

    /* A peer copy (queued on the source device's stream) lands on device 1. */
    float nine = 9.0f;
    TD_CHECK_OK(impl->fill(0, x, N, &nine, sizeof nine, s0));
    TD_CHECK_OK(impl->memcpy_peer_async(1, y, 0, x, N * sizeof(float), s0));
    TD_CHECK_OK(impl->stream_synchronize(0, s0));
    for (int i = 0; i < N; i++)
        TD_CHECK_NEAR(y[i], 9.0, 0);

    impl->event_destroy(0, e);
    impl->event_destroy(1, e1);
    impl->device_free(0, x);
    impl->device_free(1, y);
    impl->stream_destroy(0, s0);
    impl->stream_destroy(1, s1);
    sim_end();
}

TD_TEST(elapsed_ms_and_its_errors)
{
    const device_impl *impl = sim_begin();
    void *start = NULL, *end = NULL, *untimed = NULL, *unrecorded = NULL;
    TD_CHECK_OK(impl->event_create(0, TD_EVENT_ENABLE_TIMING, &start));
    TD_CHECK_OK(impl->event_create(0, TD_EVENT_ENABLE_TIMING, &end));
    TD_CHECK_OK(impl->event_create(0, TD_EVENT_DEFAULT, &untimed));
    TD_CHECK_OK(impl->event_create(0, TD_EVENT_ENABLE_TIMING, &unrecorded));

    TD_CHECK_OK(impl->event_record(0, start, NULL));
    TD_CHECK_OK(impl->event_record(0, untimed, NULL));
    TD_CHECK_OK(impl->sleep(0, ms_cycles(50), NULL));
    TD_CHECK_OK(impl->event_record(0, end, NULL));
    TD_CHECK_OK(impl->event_synchronize(0, end));
    float ms = -1;
    TD_CHECK_OK(impl->event_elapsed_ms(0, start, end, &ms));
    TD_CHECK_MSG(ms >= 45.0f && ms < 1000.0f, "elapsed %.3f ms around a 50 ms sleep", (double)ms);

    TD_CHECK_ERR(impl->event_elapsed_ms(0, start, unrecorded, &ms), TD_ERR_INVALID,
                 "Both events must be recorded before calculating elapsed time.");
    TD_CHECK_ERR(impl->event_elapsed_ms(0, untimed, end, &ms), TD_ERR_INVALID,
                 "Both events must be created with argument 'enable_timing=True'.");

    impl->event_destroy(0, start);
    impl->event_destroy(0, end);
    impl->event_destroy(0, untimed);
    impl->event_destroy(0, unrecorded);
    sim_end();
}

TD_TEST(memory_budget_and_oom_message)
{
    setenv("TDIST_SIM_MEMORY", "64M", 1);
    const device_impl *impl = sim_begin();
    const size_t mib = (size_t)1 << 20;
    size_t free_bytes = 0, total = 0;
    TD_CHECK_OK(impl->mem_get_info(0, &free_bytes, &total));
    TD_CHECK_EQ(total, 64 * mib);
    TD_CHECK_EQ(free_bytes, 64 * mib);
    td_device_properties props;
    TD_CHECK_OK(impl->properties(1, &props));
    TD_CHECK_STR_EQ(props.name, "tdist simulated device");
    TD_CHECK_EQ(props.total_memory, 64 * mib);
    TD_CHECK_EQ(props.clock_rate_khz, 1000000);
    TD_CHECK_EQ(props.multi_processor_count, 1);
    TD_CHECK_EQ(props.major, 0);

    void *big = NULL, *more = NULL, *other = NULL;
    TD_CHECK_OK(impl->device_malloc(0, 40 * mib, &big));
    TD_CHECK_OK(impl->mem_get_info(0, &free_bytes, &total));
    TD_CHECK_EQ(free_bytes, 24 * mib);
    TD_CHECK_ERR(impl->device_malloc(0, 30 * mib, &more), TD_ERR_NOMEM,
                 "Simulated device sim:0 out of memory. Tried to allocate 30.00 MiB (budget 64.00 MiB, 40.00 MiB in use)");
    TD_CHECK(more == NULL);
    /* The budget is per device. */
    TD_CHECK_OK(impl->device_malloc(1, 30 * mib, &other));
    TD_CHECK_OK(impl->mem_get_info(1, &free_bytes, &total));
    TD_CHECK_EQ(free_bytes, 34 * mib);
    impl->device_free(0, big);
    TD_CHECK_OK(impl->mem_get_info(0, &free_bytes, &total));
    TD_CHECK_EQ(free_bytes, 64 * mib);
    TD_CHECK_OK(impl->device_malloc(0, 30 * mib, &more));
    impl->device_free(0, more);
    impl->device_free(1, other);
    TD_CHECK_ERR(impl->device_malloc(2, 16, &more), TD_ERR_INVALID, NULL);

    /* After shutdown the environment is read again; a malformed count gives 0 devices. */
    sim_end();
    setenv("TDIST_SIM_DEVICES", "two", 1);
    TD_CHECK_EQ(impl->count(), 0);
    impl->shutdown();
    setenv("TDIST_SIM_DEVICES", "3", 1);
    unsetenv("TDIST_SIM_MEMORY");
    TD_CHECK_EQ(impl->count(), 3);
    TD_CHECK_OK(impl->mem_get_info(2, &free_bytes, &total));
    TD_CHECK_EQ(total, (size_t)4 << 30);
    sim_end();
}

TD_TEST(strided_copy_of_transposed_view)
{
    const device_impl *impl = sim_begin();
    enum { R = 3, C = 5 };
    int32_t host_src[R * C], host_dst[C * R];
    for (int i = 0; i < R * C; i++)
        host_src[i] = 100 + i;
    memset(host_dst, 0, sizeof host_dst);
    void *src = NULL, *dst = NULL;
    TD_CHECK_OK(impl->device_malloc(0, sizeof host_src, &src));
    TD_CHECK_OK(impl->device_malloc(0, sizeof host_dst, &dst));
    TD_CHECK_OK(impl->memcpy_async(0, src, host_src, sizeof host_src, DEVICE_COPY_H2D, NULL));

    /* dst (C x R, contiguous) = src.t(): the view has sizes (C, R) and strides (1, C). */
    device_strided d = {.base = dst, .ndim = 2, .sizes = {C, R}, .strides = {R, 1}};
    device_strided s = {.base = src, .ndim = 2, .sizes = {C, R}, .strides = {1, C}};
    TD_CHECK_OK(impl->strided_copy(0, &d, &s, sizeof(int32_t), NULL));
    TD_CHECK_OK(impl->memcpy_async(0, host_dst, dst, sizeof host_dst, DEVICE_COPY_D2H, NULL));
    TD_CHECK_OK(impl->stream_synchronize(0, NULL));
    for (int i = 0; i < C; i++)
        for (int j = 0; j < R; j++)
            TD_CHECK_EQ(host_dst[i * R + j], host_src[j * C + i]);

    TD_CHECK_ERR(impl->strided_copy(0, &d, &s, 3, NULL), TD_ERR_INVALID, NULL);
    impl->device_free(0, src);
    impl->device_free(0, dst);
    sim_end();
}

TD_TEST(default_streams_of_two_devices_overlap)
{
    const device_impl *impl = sim_begin();
    void *s = NULL;
    TD_CHECK_OK(impl->stream_create(0, 0, &s));
    int64_t t0 = clock_now_ns();
    TD_CHECK_OK(impl->sleep(0, ms_cycles(100), NULL));
    TD_CHECK_OK(impl->sleep(1, ms_cycles(100), NULL));
    TD_CHECK_OK(impl->sleep(0, ms_cycles(100), s));
    TD_CHECK_EQ(device_sim_thread_count(), 3);
    /* device_synchronize(0) waits for every stream of device 0, the created one too. */
    TD_CHECK_OK(impl->device_synchronize(0));
    TD_CHECK_EQ(impl->stream_query(0, s), 1);
    TD_CHECK_EQ(impl->stream_query(0, NULL), 1);
    TD_CHECK_OK(impl->device_synchronize(1));
    TD_CHECK_EQ(impl->stream_query(1, NULL), 1);
    int64_t took_ms = (clock_now_ns() - t0) / 1000000;
    TD_CHECK_MSG(took_ms >= 95 && took_ms < 180, "three 100 ms sleeps on three streams took %lld ms",
                 (long long)took_ms);
    impl->stream_destroy(0, s);
    sim_end();
}

TD_TEST(destroy_drains_queued_work)
{
    const device_impl *impl = sim_begin();
    enum { N = 512 };
    void *s = NULL;
    TD_CHECK_OK(impl->stream_create(1, 0, &s));
    TD_CHECK_EQ(device_sim_thread_count(), 1);
    float *buf = dev_floats(impl, 1, N);
    float zero = 0.0f, nine = 9.0f;
    TD_CHECK_OK(impl->fill(1, buf, N, &zero, sizeof zero, s));
    TD_CHECK_OK(impl->stream_synchronize(1, s));
    TD_CHECK_OK(impl->sleep(1, ms_cycles(50), s));
    TD_CHECK_OK(impl->fill(1, buf, N, &nine, sizeof nine, s));
    TD_CHECK_EQ(impl->stream_query(1, s), 0);
    impl->stream_destroy(1, s);
    TD_CHECK_EQ(device_sim_thread_count(), 0);
    for (int i = 0; i < N; i++)
        TD_CHECK_NEAR(buf[i], 9.0, 0);
    impl->device_free(1, buf);
    sim_end();
}

TD_TEST_MAIN()
