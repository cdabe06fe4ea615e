/* Shared set-up of the device tests (device_util.h): the instance parameter picks sim or cuda,
 * too few devices skip with the harness's codes, and each body ends with a leak check. */
#include "device_util.h"

#include "device/device_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TDIST_SANITIZED
/* The CUDA driver maps memory where AddressSanitizer protects its shadow gap, and cuInit then
 * fails with "out of memory": every device test binary leaves the gap unprotected. */
__attribute__((visibility("default"))) const char *__asan_default_options(void);
__attribute__((visibility("default"))) const char *__asan_default_options(void)
{
    return "protect_shadow_gap=0";
}
#endif

static td_device_type chosen = TD_DEVICE_SIM;

td_device_type dev_setup(td_test_ctx *ctx, int need)
{
    const char *param = ctx->param ? ctx->param : "";
    if (strncmp(param, "sim", 3) == 0) {
        setenv("TDIST_DEVICE", "sim", 1);
        setenv("TDIST_SIM_DEVICES", param[3] ? param + 3 : "2", 1);
        chosen = TD_DEVICE_SIM;
    } else if (strcmp(param, "cuda") == 0) {
        setenv("TDIST_DEVICE", "cuda", 1);
        chosen = TD_DEVICE_CUDA;
    } else {
        chosen = td_device_default_type();
    }
    int have = td_device_count(chosen);
    if (have == 0 && chosen == TD_DEVICE_CUDA)
        TD_SKIP(TD_SKIP_NO_CUDA, "CUDA is not available.");
    if (have < need) {
        int code = td_skip_multi_gpu(need);
        TD_SKIP(code > 0 ? code : TD_SKIP_GENERIC, "not enough devices");
    }
    return chosen;
}

void dev_process_setup(td_test_ctx *ctx)
{
    if (ctx->param && ctx->param[0] && strcmp(ctx->param, "cuda") != 0)
        return; /* sim instances */
    if (ctx->param && ctx->param[0])
        setenv("TDIST_DEVICE", "cuda", 1);
    /* Through the implementation, not the runtime, so no allocator statistic moves. */
    const device_impl *impl = device_impl_of(TD_DEVICE_CUDA);
    int n = impl->count();
    for (int i = 0; i < n; i++) {
        /* The context, a device allocation, the kernels (a zero-cycle sleep) and an interprocess
         * event (the driver opens a /dev/shm file for those) on every device. */
        size_t free_bytes = 0, total_bytes = 0;
        void *p = NULL, *ev = NULL;
        td_status st = impl->mem_get_info(i, &free_bytes, &total_bytes);
        if (st == TD_OK)
            st = impl->device_malloc(i, 512, &p);
        if (st == TD_OK)
            st = impl->sleep(i, 0, NULL);
        if (st == TD_OK)
            st = impl->event_create(i, TD_EVENT_INTERPROCESS, &ev);
        if (st == TD_OK)
            st = impl->event_record(i, ev, NULL);
        if (st == TD_OK)
            st = impl->stream_synchronize(i, NULL);
        if (st != TD_OK)
            fprintf(stderr, "dev_process_setup: warming cuda:%d: %s\n", i, td_last_error());
        if (ev)
            impl->event_destroy(i, ev);
        if (p)
            impl->device_free(i, p);
    }
}

td_device dev(int i)
{
    td_device d = {chosen, i};
    return d;
}

void dev_teardown(void)
{
    td_device_live live;
    td_device_live_get(&live);
    TD_CHECK_MSG(live.streams == 0 && live.events == 0 && live.allocated_bytes == 0 && live.host_blocks == 0,
                 "device objects left after the test: %lld streams, %lld events, %lld bytes, %lld pinned blocks",
                 (long long)live.streams, (long long)live.events, (long long)live.allocated_bytes,
                 (long long)live.host_blocks);
    TD_CHECK_OK(td_device_shutdown());
    td_device_live_get(&live);
    TD_CHECK_EQ(live.threads, 0);
}

td_device dev_current(void)
{
    td_device d = {chosen, -1};
    return d;
}

void dev_finish(void)
{
    int n = td_device_count(chosen);
    for (int i = 0; i < n; i++)
        TD_CHECK_OK(td_device_synchronize(dev(i)));
    dev_teardown();
}

td_tensor *dev_to(td_tensor *t, td_device d)
{
    td_tensor *out = NULL;
    TD_CHECK_OK(td_tensor_to_device(t, d, false, &out));
    return out;
}

td_tensor *dev_host_arange(td_dtype dtype, td_shape shape, double mul)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_empty(dtype, shape, &t));
    int64_t n = td_tensor_numel(t);
    td_tensor *flat = NULL;
    TD_CHECK_OK(td_tensor_view(t, TD_SHAPE(n), &flat));
    for (int64_t i = 0; i < n; i++)
        TD_CHECK_OK(td_tensor_set_f64(flat, &i, (double)i * mul));
    td_tensor_release(flat);
    return t;
}

double dev_get(const td_tensor *t, int64_t flat_index)
{
    td_device cpu = {TD_DEVICE_CPU, -1};
    td_tensor *host = NULL, *contig = NULL, *flat = NULL;
    TD_CHECK_OK(td_tensor_to_device((td_tensor *)t, cpu, false, &host));
    TD_CHECK_OK(td_tensor_contiguous(host, &contig));
    TD_CHECK_OK(td_tensor_view(contig, TD_SHAPE(td_tensor_numel(contig)), &flat));
    double v = 0;
    TD_CHECK_OK(td_tensor_get_f64(flat, &flat_index, &v));
    td_tensor_release(flat);
    td_tensor_release(contig);
    td_tensor_release(host);
    return v;
}
