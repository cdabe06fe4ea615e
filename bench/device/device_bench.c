/* device_bench: what the device runtime costs and moves, on the device type TDIST_DEVICE names
 * (sim or cuda; run.sh sets it).
 *   - allocator: td_device_malloc + td_device_free pairs per second from the cache, by size
 *     (PyTorch's caching allocator is the peer: torch_device_bench.py);
 *   - copies: host (pinned) to device, device to host, device to device, GB/s;
 *   - broadcast_coalesced of 64 tensors and reduce_add of one tensor per device, GB/s of payload
 *     per destination device, with 2+ devices.
 * Output: markdown table rows "| what | size | value | unit |". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/device.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define CHECK(expr)                                                                  \
    do {                                                                             \
        td_status st_ = (expr);                                                      \
        if (st_ != TD_OK) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, td_last_error()); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

static void size_str(size_t n, char *buf, size_t len)
{
    if (n >= (1u << 20))
        snprintf(buf, len, "%zu MiB", n >> 20);
    else if (n >= 1024)
        snprintf(buf, len, "%zu KiB", n >> 10);
    else
        snprintf(buf, len, "%zu B", n);
}

static void bench_allocator(td_device d, bool quick)
{
    static const size_t sizes[] = {512, 64 << 10, 4 << 20, 64 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = NULL;
        CHECK(td_device_malloc(d, sizes[i], NULL, &p)); /* warm the cache */
        td_device_free(p);
        long n = quick ? 20000 : 200000;
        double t0 = now_s();
        for (long k = 0; k < n; k++) {
            CHECK(td_device_malloc(d, sizes[i], NULL, &p));
            td_device_free(p);
        }
        double dt = now_s() - t0;
        char s[32];
        size_str(sizes[i], s, sizeof s);
        printf("| allocator malloc+free | %s | %.2f | M pairs/s |\n", s, (double)n / dt / 1e6);
    }
}

static double time_copy(td_tensor *dst, td_tensor *src, td_stream *sync, int reps)
{
    CHECK(td_tensor_copy_ex(dst, src, true));
    CHECK(td_stream_synchronize(sync));
    double t0 = now_s();
    for (int r = 0; r < reps; r++)
        CHECK(td_tensor_copy_ex(dst, src, true));
    CHECK(td_stream_synchronize(sync));
    return (now_s() - t0) / reps;
}

static void bench_copies(td_device d, int ndev, bool quick)
{
    static const int64_t sizes[] = {1 << 20, 64 << 20};
    td_device cpu = {TD_DEVICE_CPU, -1};
    td_stream *cur = NULL;
    CHECK(td_stream_current(d, &cur));
    for (size_t i = 0; i < 2; i++) {
        int64_t n = sizes[i] / 4;
        td_tensor *host = NULL, *pinned = NULL, *dev0 = NULL, *dev1 = NULL;
        CHECK(td_tensor_empty_on(cpu, TD_FLOAT32, TD_SHAPE(n), NULL, &host));
        CHECK(td_tensor_pin_memory(host, &pinned));
        CHECK(td_tensor_empty_on(d, TD_FLOAT32, TD_SHAPE(n), NULL, &dev0));
        int reps = quick ? 3 : (i == 0 ? 200 : 20);
        char s[32];
        size_str((size_t)sizes[i], s, sizeof s);
        printf("| copy host->device (pinned) | %s | %.2f | GB/s |\n", s,
               (double)sizes[i] / time_copy(dev0, pinned, cur, reps) / 1e9);
        printf("| copy device->host (pinned) | %s | %.2f | GB/s |\n", s,
               (double)sizes[i] / time_copy(pinned, dev0, cur, reps) / 1e9);
        CHECK(td_tensor_empty_on(d, TD_FLOAT32, TD_SHAPE(n), NULL, &dev1));
        printf("| copy device->device (same) | %s | %.2f | GB/s |\n", s,
               (double)sizes[i] / time_copy(dev1, dev0, cur, reps) / 1e9);
        td_tensor_release(dev1);
        if (ndev >= 2) {
            td_device d1 = {d.type, 1};
            td_stream *cur1 = NULL;
            CHECK(td_stream_current(d1, &cur1));
            CHECK(td_tensor_empty_on(d1, TD_FLOAT32, TD_SHAPE(n), NULL, &dev1));
            double t = time_copy(dev1, dev0, cur, reps);
            CHECK(td_stream_synchronize(cur1));
            printf("| copy device 0->1 (peer) | %s | %.2f | GB/s |\n", s, (double)sizes[i] / t / 1e9);
            td_tensor_release(dev1);
        }
        td_tensor_release(dev0);
        td_tensor_release(pinned);
        td_tensor_release(host);
    }
}

static void sync_all(td_device_type type, int ndev)
{
    for (int i = 0; i < ndev; i++) {
        td_device di = {type, i};
        CHECK(td_device_synchronize(di));
    }
}

static void bench_comm(td_device_type type, int ndev, bool quick)
{
    td_device devs[8];
    if (ndev > 8)
        ndev = 8;
    for (int i = 0; i < ndev; i++)
        devs[i] = (td_device){type, i};
    static const int64_t totals[] = {1 << 20, 64 << 20};
    for (size_t k = 0; k < 2; k++) {
        enum { NT = 64 };
        td_tensor *ts[NT];
        for (int i = 0; i < NT; i++)
            CHECK(td_tensor_full_on(devs[0], TD_FLOAT32, TD_SHAPE(totals[k] / 4 / NT), 1.0, &ts[i]));
        td_tensor **out = calloc((size_t)(NT * ndev), sizeof *out);
        int reps = quick ? 2 : (k == 0 ? 50 : 5);
        double best = 1e30;
        for (int r = 0; r < reps + 1; r++) {
            sync_all(type, ndev);
            double t0 = now_s();
            CHECK(td_comm_broadcast_coalesced(ts, NT, devs, ndev, 0, out));
            sync_all(type, ndev);
            double dt = now_s() - t0;
            if (r > 0 && dt < best)
                best = dt;
            for (int i = 0; i < NT * ndev; i++)
                td_tensor_release(out[i]);
        }
        char s[32];
        size_str((size_t)totals[k], s, sizeof s);
        printf("| broadcast_coalesced 64 tensors to %d devices | %s | %.2f | GB/s per destination |\n", ndev, s,
               (double)totals[k] / best / 1e9);
        for (int i = 0; i < NT; i++)
            td_tensor_release(ts[i]);
        free(out);

        td_tensor *in[8];
        for (int i = 0; i < ndev; i++)
            CHECK(td_tensor_full_on(devs[i], TD_FLOAT32, TD_SHAPE(totals[k] / 4), 1.0, &in[i]));
        best = 1e30;
        for (int r = 0; r < reps + 1; r++) {
            td_tensor *sum = NULL;
            sync_all(type, ndev);
            double t0 = now_s();
            CHECK(td_comm_reduce_add(in, ndev, devs[0], &sum));
            sync_all(type, ndev);
            double dt = now_s() - t0;
            if (r > 0 && dt < best)
                best = dt;
            td_tensor_release(sum);
        }
        printf("| reduce_add of %d tensors | %s | %.2f | GB/s per input |\n", ndev, s, (double)totals[k] / best / 1e9);
        for (int i = 0; i < ndev; i++)
            td_tensor_release(in[i]);
    }
}

int main(int argc, char **argv)
{
    bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    td_device_type type = td_device_default_type();
    int ndev = td_device_count(type);
    if (ndev < 1) {
        fprintf(stderr, "device_bench: no %s devices (set TDIST_DEVICE=sim TDIST_SIM_DEVICES=2)\n",
                td_device_type_name(type));
        return 77;
    }
    td_device d0 = {type, 0};
    td_device_properties props;
    CHECK(td_device_get_properties(d0, &props));
    printf("<!-- %d %s device(s): %s -->\n", ndev, td_device_type_name(type), props.name);
    printf("| what | size | value | unit |\n| --- | --- | ---: | --- |\n");
    bench_allocator(d0, quick);
    bench_copies(d0, ndev, quick);
    if (ndev >= 2)
        bench_comm(type, ndev, quick);
    CHECK(td_device_empty_cache());
    CHECK(td_host_empty_cache());
    CHECK(td_device_shutdown());
    return 0;
}
