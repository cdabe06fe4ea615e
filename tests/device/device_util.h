/* Shared set-up of the device tests: which device type and how many devices an instance runs on,
 * and the leak check after each body. */
#ifndef TDIST_TESTS_DEVICE_UTIL_H
#define TDIST_TESTS_DEVICE_UTIL_H

#include <tdist/device.h>
#include <tdist/testing.h>

/* The parameters every device case runs with: 2 and 4 simulated devices, and real GPUs. */
#define DEV_PARAMS "sim2,sim4,cuda"

/* The harness's per-process set-up of a device case (.setup runs before the fd and thread
 * baseline): on cuda it opens the driver, makes every device's context and loads the kernels, then
 * shuts the runtime down, so what the driver keeps for the life of the process (its fds and
 * threads) is in the baseline and the check sees only what the body leaves. Cases without a
 * parameter are warmed as cuda ones; sim instances need nothing. */
void dev_process_setup(td_test_ctx *ctx);

/* A device case's options: TD_TEST(name, DEV_CASE) { ... }. */
#define DEV_CASE .params = DEV_PARAMS, .setup = dev_process_setup

/* Call first in a body, before any device call. Selects the device type from the instance's
 * parameter ("sim2" / "sim4": TDIST_DEVICE=sim with TDIST_SIM_DEVICES=2 / 4; "cuda": real GPUs)
 * and skips with the harness's code ("Need at least N CUDA devices", or "CUDA is not available.")
 * when fewer than `need` devices exist. Returns the type the case runs on. */
td_device_type dev_setup(td_test_ctx *ctx, int need);

/* The device with index i of the type dev_setup chose. */
td_device dev(int i);

/* Call last in a body: nothing may be live on the device side (streams, events, allocated
 * memory, pinned blocks) and the runtime must shut down cleanly (its threads joined), so the
 * harness's fd and thread check sees what the body leaked. */
void dev_teardown(void);

/* The current device of the chosen type (index -1). */
td_device dev_current(void);

/* Call last in a body that queued copies: cross-device copies run on the source device's stream,
 * which nothing in a body may have waited for, so every device is synchronized before
 * dev_teardown's leak check frees the cached memory. */
void dev_finish(void);

/* td_tensor helpers: a blocking td_tensor_to_device that must succeed, a float32 host tensor of n
 * elements 0, 1, ..., n-1 (scaled by mul), and reading element i of any tensor (device tensors are
 * copied to the host). */
td_tensor *dev_to(td_tensor *t, td_device d);
td_tensor *dev_host_arange(td_dtype dtype, td_shape shape, double mul);
double dev_get(const td_tensor *t, int64_t flat_index);

#endif
