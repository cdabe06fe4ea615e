/* Devices, streams and events (spec/cuda_multigpu.md sections 1, 3, 4 and 12), ported by name from
 * test_cuda_multigpu.py: synchronize and its device-argument errors, the device guard's
 * restore-at-entry rule, device values as map keys, current and default streams per thread and
 * per device, the stream guard's three-way restore, queries and synchronization from any current
 * device, stream equality and hashing across devices, priorities, event devices and their lazy
 * creation, cross-device waits and elapsed times, external (wrapped) streams, blocking waits on two
 * devices from two threads at once (no library lock held while waiting), the first device use
 * racing on two threads, the thread-local ownership of current streams, and the interprocess flag
 * rules of events. Every case runs on sim2, sim4 and cuda and ends with dev_teardown's leak check.
 * What a seed test checks on one device is in a *_one_device case (dev_setup(ctx, 1)), so that it
 * runs on a machine with one GPU; the seed's name keeps what needs two. */
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/device.h>
#include <tdist/testing.h>

#include "base/error.h"
#include "device/device_impl.h"
#include "device_util.h"

#define FIFTY_MIL_CYCLES 50000000LL

static td_device cpu_device(void)
{
    td_device d = {TD_DEVICE_CPU, -1};
    return d;
}

/* The ValueError for a cpu device where the accelerator is needed, naming the accelerator type. */
static void check_not_accelerator(td_status st, td_device_type type)
{
    char want[64];
    snprintf(want, sizeof want, "Expected a %s device, but got: cpu", td_device_type_name(type));
    TD_CHECK_ERR(st, TD_ERR_INVALID, want);
    TD_CHECK_MSG(error_type() && strcmp(error_type(), "ValueError") == 0, "error type %s, expected ValueError",
                 error_type() ? error_type() : "(none)");
}

static td_stream *current_stream(td_device d)
{
    td_stream *s = NULL;
    TD_CHECK_OK(td_stream_current(d, &s));
    TD_CHECK(s != NULL);
    return s;
}

static td_stream *default_stream(td_device d)
{
    td_stream *s = NULL;
    TD_CHECK_OK(td_stream_default(d, &s));
    TD_CHECK(s != NULL);
    return s;
}

static td_stream *new_stream(td_device d, int priority)
{
    td_stream *s = NULL;
    TD_CHECK_OK(td_stream_create(d, priority, &s));
    TD_CHECK(s != NULL);
    return s;
}

static td_event *new_event(unsigned flags)
{
    td_event *e = NULL;
    TD_CHECK_OK(td_event_create(flags, &e));
    TD_CHECK(e != NULL);
    return e;
}

static void check_device(td_device got, td_device want)
{
    char a[32], b[32];
    TD_CHECK_MSG(td_device_equal(got, want), "device %s, expected %s", td_device_str(got, a, sizeof a),
                 td_device_str(want, b, sizeof b));
}

static int64_t live_streams(void)
{
    td_device_live live;
    td_device_live_get(&live);
    return live.streams;
}

/* ---- devices ------------------------------------------------------------------------------- */

TD_TEST(test_cuda_synchronize, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    const char *name = td_device_type_name(type);
    td_device d;
    char spec[32];

    TD_CHECK_OK(td_device_synchronize(dev(-1)));
    TD_CHECK_OK(td_device_parse(name, &d));
    TD_CHECK_EQ(d.index, -1);
    TD_CHECK_OK(td_device_synchronize(d));
    snprintf(spec, sizeof spec, "%s:0", name);
    TD_CHECK_OK(td_device_parse(spec, &d));
    TD_CHECK_OK(td_device_synchronize(d));
    TD_CHECK_OK(td_device_synchronize(dev(0)));

    /* synchronize waits for the device's queued work. */
    TD_CHECK_OK(td_stream_sleep(current_stream(dev(0)), FIFTY_MIL_CYCLES));
    TD_CHECK(!td_stream_query(current_stream(dev(0))));
    TD_CHECK_OK(td_device_synchronize(dev(0)));
    TD_CHECK(td_stream_query(current_stream(dev(0))));

    if (td_device_count(type) >= 2) {
        snprintf(spec, sizeof spec, "%s:1", name);
        TD_CHECK_OK(td_device_parse(spec, &d));
        TD_CHECK_OK(td_device_synchronize(d));
        TD_CHECK_OK(td_device_synchronize(dev(1)));
        /* Only the named device: device 1's work is still queued after synchronizing device 0. */
        TD_CHECK_OK(td_stream_sleep(current_stream(dev(1)), FIFTY_MIL_CYCLES));
        TD_CHECK_OK(td_device_synchronize(dev(0)));
        TD_CHECK(!td_stream_query(current_stream(dev(1))));
        /* And with no device argument, the current device only. */
        TD_CHECK_OK(td_device_synchronize(dev(-1)));
        TD_CHECK(!td_stream_query(current_stream(dev(1))));
        TD_CHECK_OK(td_device_synchronize(dev(1)));
        TD_CHECK(td_stream_query(current_stream(dev(1))));
    }

    check_not_accelerator(td_device_synchronize(cpu_device()), type);
    TD_CHECK_OK(td_device_parse("cpu", &d));
    check_not_accelerator(td_device_synchronize(d), type);

    /* A device that does not exist, and a negative index other than -1. */
    char want[96];
    int count = td_device_count(type);
    snprintf(want, sizeof want, "Invalid device ordinal %d: there %s %d %s device%s", count + 7,
             count == 1 ? "is" : "are", count, name, count == 1 ? "" : "s");
    TD_CHECK_ERR(td_device_synchronize(dev(count + 7)), TD_ERR_INVALID, want);
    TD_CHECK_ERR(td_device_synchronize(dev(count)), TD_ERR_INVALID, "Invalid device ordinal");
    TD_CHECK_ERR(td_device_synchronize(dev(-2)), TD_ERR_INVALID, "Expected non-negative device index, but got -2");
    td_device resolved;
    TD_CHECK_ERR(td_device_resolve(dev(count), &resolved), TD_ERR_INVALID, "Invalid device ordinal");
    check_not_accelerator(td_device_resolve(cpu_device(), &resolved), type);
    dev_teardown();
}

/* spec 1.1's table: a guard's exit restores the device it saw at entry, whatever was set inside. */
TD_TEST(test_cuda_set_device, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 2);
    TD_CHECK_EQ(td_device_current(type), 0);
    td_device_guard outer, inner;
    TD_CHECK_OK(td_device_guard_enter(&outer, dev(1)));
    TD_CHECK_EQ(td_device_current(type), 1);
    TD_CHECK_OK(td_device_set(dev(0)));
    TD_CHECK_EQ(td_device_current(type), 0);
    TD_CHECK_OK(td_device_guard_enter(&inner, dev(1)));
    TD_CHECK_EQ(td_device_current(type), 1);
    td_device_guard_exit(&inner);
    TD_CHECK_EQ(td_device_current(type), 0);
    TD_CHECK_OK(td_device_set(dev(1)));
    TD_CHECK_EQ(td_device_current(type), 1);
    td_device_guard_exit(&outer);
    TD_CHECK_EQ(td_device_current(type), 0);

    /* The same table entered from device 1: each exit restores 1, the device seen at its entry. */
    TD_CHECK_OK(td_device_set(dev(1)));
    TD_CHECK_OK(td_device_guard_enter(&outer, dev(0)));
    TD_CHECK_EQ(td_device_current(type), 0);
    TD_CHECK_OK(td_device_set(dev(1)));
    TD_CHECK_OK(td_device_guard_enter(&inner, dev(0)));
    TD_CHECK_EQ(td_device_current(type), 0);
    TD_CHECK_OK(td_device_set(dev(1)));
    td_device_guard_exit(&inner);
    TD_CHECK_EQ(td_device_current(type), 1);
    TD_CHECK_OK(td_device_set(dev(0)));
    td_device_guard_exit(&outer);
    TD_CHECK_EQ(td_device_current(type), 1);
    TD_CHECK_OK(td_device_set(dev(0)));

    /* A -1 guard does nothing, even when the device changes inside it. */
    TD_CHECK_OK(td_device_set(dev(1)));
    TD_CHECK_OK(td_device_guard_enter(&outer, dev(-1)));
    TD_CHECK_EQ(td_device_current(type), 1);
    TD_CHECK_OK(td_device_set(dev(0)));
    td_device_guard_exit(&outer);
    TD_CHECK_EQ(td_device_current(type), 0);

    /* The other accelerator type's current device is separate. */
    td_device_type other = type == TD_DEVICE_SIM ? TD_DEVICE_CUDA : TD_DEVICE_SIM;
    TD_CHECK_OK(td_device_set(dev(1)));
    TD_CHECK_EQ(td_device_current(other), 0);
    TD_CHECK_EQ(td_device_current(TD_DEVICE_CPU), -1);
    TD_CHECK_OK(td_device_set(dev(0)));
    dev_teardown();
}

/* test_cuda_set_device's one-device rules: guards on device 0, a cpu guard and a -1 guard do
 * nothing, and a failed guard or set changes nothing. */
TD_TEST(test_cuda_set_device_one_device, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    TD_CHECK_EQ(td_device_current(type), 0);
    td_device_guard outer, inner;
    TD_CHECK_OK(td_device_guard_enter(&outer, dev(0)));
    TD_CHECK_EQ(td_device_current(type), 0);
    TD_CHECK_OK(td_device_guard_enter(&inner, dev(-1)));
    TD_CHECK_OK(td_device_set(dev(0)));
    td_device_guard_exit(&inner);
    td_device_guard_exit(&outer);
    TD_CHECK_EQ(td_device_current(type), 0);

    TD_CHECK_OK(td_device_guard_enter(&outer, cpu_device()));
    TD_CHECK_EQ(td_device_current(type), 0);
    td_device_guard_exit(&outer);
    TD_CHECK_EQ(td_device_current(type), 0);

    /* A failed guard or set changes nothing. */
    TD_CHECK_ERR(td_device_guard_enter(&outer, dev(td_device_count(type))), TD_ERR_INVALID, "Invalid device ordinal");
    td_device_guard_exit(&outer);
    TD_CHECK_EQ(td_device_current(type), 0);
    TD_CHECK_ERR(td_device_set(dev(td_device_count(type))), TD_ERR_INVALID, "Invalid device ordinal");
    check_not_accelerator(td_device_set(cpu_device()), type);
    TD_CHECK_EQ(td_device_current(type), 0);
    TD_CHECK_EQ(td_device_current(TD_DEVICE_CPU), -1);
    dev_teardown();
}

/* A small map keyed by device, as GradScaler's per-device dict: lookup by hash, then equality. */
typedef struct device_map {
    struct {
        bool used;
        td_device key;
        const char *value;
    } slot[16];
    int size;
} device_map;

static void map_put(device_map *m, td_device key, const char *value)
{
    size_t i = (size_t)(td_device_hash(key) % 16);
    while (m->slot[i].used && !td_device_equal(m->slot[i].key, key))
        i = (i + 1) % 16;
    if (!m->slot[i].used)
        m->size++;
    m->slot[i].used = true;
    m->slot[i].key = key;
    m->slot[i].value = value;
}

static const char *map_get(const device_map *m, td_device key)
{
    size_t i = (size_t)(td_device_hash(key) % 16);
    while (m->slot[i].used) {
        if (td_device_equal(m->slot[i].key, key))
            return m->slot[i].value;
        i = (i + 1) % 16;
    }
    return NULL;
}

/* Device values: parse, str, equal, hash; test_grad_scaling_device_as_key's device-as-key rule. */
TD_TEST(test_grad_scaling_device_as_key, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 2);
    const char *name = td_device_type_name(type);
    char spec[32];
    td_device dev0a, dev0b, dev1a, dev1b;
    snprintf(spec, sizeof spec, "%s:0", name);
    TD_CHECK_OK(td_device_parse(spec, &dev0a));
    dev0b = dev(0);
    snprintf(spec, sizeof spec, "%s:1", name);
    TD_CHECK_OK(td_device_parse(spec, &dev1a));
    dev1b = dev(1);
    TD_CHECK(td_device_equal(dev0a, dev0b));
    TD_CHECK(td_device_equal(dev1a, dev1b));
    TD_CHECK(!td_device_equal(dev0a, dev1a));
    TD_CHECK_EQ(td_device_hash(dev0a), td_device_hash(dev0b));
    TD_CHECK_EQ(td_device_hash(dev1a), td_device_hash(dev1b));
    TD_CHECK(td_device_hash(dev0a) != td_device_hash(dev1a));

    /* Two devices are two keys; t.device of device 1's stream is device 1's key (the one-device
     * rules are test_device_values_one_device's). */
    device_map m;
    memset(&m, 0, sizeof m);
    map_put(&m, dev0a, "0a");
    map_put(&m, dev1a, "1a");
    TD_CHECK_EQ(m.size, 2);
    TD_CHECK_STR_EQ(map_get(&m, dev0b), "0a");
    TD_CHECK_STR_EQ(map_get(&m, dev1b), "1a");
    map_put(&m, td_stream_device(default_stream(dev(1))), "t");
    TD_CHECK_EQ(m.size, 2);
    TD_CHECK_STR_EQ(map_get(&m, dev1a), "t");
    TD_CHECK_STR_EQ(map_get(&m, dev0a), "0a");
    TD_CHECK(map_get(&m, cpu_device()) == NULL);

    /* Resolving: -1 becomes the thread's current device, device 1 inside a guard. */
    td_device r;
    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, dev(1)));
    TD_CHECK_OK(td_device_resolve(dev(-1), &r));
    check_device(r, dev(1));
    td_device_guard_exit(&g);
    TD_CHECK_OK(td_device_resolve(dev(-1), &r));
    check_device(r, dev(0));
    dev_teardown();
}

/* Device values on one device: device 0 spelled two ways is one key, a device a runtime object
 * reports is that key too, -1 is another value; parsing, printing and resolving. */
TD_TEST(test_device_values_one_device, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    const char *name = td_device_type_name(type);
    char spec[32], buf[32];
    td_device dev0a, dev0b = dev(0);
    snprintf(spec, sizeof spec, "%s:0", name);
    TD_CHECK_OK(td_device_parse(spec, &dev0a));
    TD_CHECK(td_device_equal(dev0a, dev0b));
    TD_CHECK_EQ(td_device_hash(dev0a), td_device_hash(dev0b));
    device_map m;
    memset(&m, 0, sizeof m);
    map_put(&m, dev0a, "0a");
    map_put(&m, dev0b, "0b");
    TD_CHECK_EQ(m.size, 1);
    TD_CHECK_STR_EQ(map_get(&m, dev0a), "0b");
    map_put(&m, td_stream_device(default_stream(dev(0))), "t");
    TD_CHECK_EQ(m.size, 1);
    TD_CHECK_STR_EQ(map_get(&m, dev0b), "t");
    TD_CHECK(map_get(&m, cpu_device()) == NULL);
    /* The unspecified index is a different value from index 0 (it resolves at the point of use). */
    TD_CHECK(!td_device_equal(dev(-1), dev(0)));

    /* Parsing and printing. */
    static const struct {
        const char *spec;
        td_device_type type;
        int index;
    } good[] = {{"cpu", TD_DEVICE_CPU, -1},   {"cpu:0", TD_DEVICE_CPU, 0},     {"cuda", TD_DEVICE_CUDA, -1},
                {"cuda:1", TD_DEVICE_CUDA, 1}, {"cuda:12", TD_DEVICE_CUDA, 12}, {"sim", TD_DEVICE_SIM, -1},
                {"sim:0", TD_DEVICE_SIM, 0},   {"sim:3", TD_DEVICE_SIM, 3}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        td_device d = {TD_DEVICE_CPU, 99};
        TD_CHECK_OK(td_device_parse(good[i].spec, &d));
        TD_CHECK_EQ(d.type, good[i].type);
        TD_CHECK_EQ(d.index, good[i].index);
        TD_CHECK_STR_EQ(td_device_str(d, buf, sizeof buf), good[i].spec);
    }
    static const char *const bad[] = {"",       "gpu",   "cuda:",   "cuda:-1", "cuda:1x", "cpu:1", "cuda1",
                                      " cuda:0", "sim:0:1", "CUDA:0", "sim:+1",  "cudax",   "cuda:99999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        td_device d;
        TD_CHECK_ERR(td_device_parse(bad[i], &d), TD_ERR_INVALID, "device type at start of device string");
    }
    TD_CHECK_STR_EQ(td_device_type_name(TD_DEVICE_CPU), "cpu");
    TD_CHECK_STR_EQ(td_device_type_name(TD_DEVICE_CUDA), "cuda");
    TD_CHECK_STR_EQ(td_device_type_name(TD_DEVICE_SIM), "sim");
    TD_CHECK_EQ(td_device_count(TD_DEVICE_CPU), 1);
    TD_CHECK_EQ(td_device_default_type(), type);

    /* Resolving: -1 becomes the thread's current device. */
    td_device r;
    TD_CHECK_OK(td_device_resolve(dev(-1), &r));
    check_device(r, dev(0));
    dev_teardown();
}

/* ---- streams ------------------------------------------------------------------------------- */

TD_TEST(test_current_stream, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_device d0 = dev(0), d1 = dev(1);
    td_stream *s0 = current_stream(dev(-1));
    td_stream *s1 = current_stream(d1);
    td_stream *s2 = current_stream(d0);
    check_device(td_stream_device(s0), d0);
    check_device(td_stream_device(s1), d1);
    check_device(td_stream_device(s2), d0);
    TD_CHECK(td_stream_equal(s0, s2));

    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, d1));
    s0 = current_stream(dev(-1));
    s1 = current_stream(d1);
    s2 = current_stream(d0);
    td_device_guard_exit(&g);
    check_device(td_stream_device(s0), d1);
    check_device(td_stream_device(s1), d1);
    check_device(td_stream_device(s2), d0);
    TD_CHECK(td_stream_equal(s0, s1));
    TD_CHECK(!td_stream_equal(s0, s2));
    dev_teardown();
}

/* The current stream of device 0, asked for as the current device and by index; a set current
 * stream is what both return; cpu has none. */
TD_TEST(test_current_stream_one_device, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    td_stream *s0 = current_stream(dev(-1)), *s1 = current_stream(dev(0));
    check_device(td_stream_device(s0), dev(0));
    TD_CHECK(td_stream_equal(s0, s1));
    TD_CHECK(td_stream_equal(s0, default_stream(dev(0))));
    td_stream *mine = new_stream(dev(0), 0);
    TD_CHECK_OK(td_stream_set_current(mine));
    TD_CHECK(td_stream_equal(current_stream(dev(-1)), mine));
    TD_CHECK(td_stream_equal(current_stream(dev(0)), mine));
    TD_CHECK_OK(td_stream_set_current(default_stream(dev(0))));
    td_stream_release(mine);

    td_stream *out = NULL;
    check_not_accelerator(td_stream_current(cpu_device(), &out), type);
    dev_teardown();
}

TD_TEST(test_default_stream, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_device d0 = dev(0), d1 = dev(1);
    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, d0));
    td_stream *s0 = default_stream(dev(-1));
    td_device_guard_exit(&g);
    TD_CHECK_OK(td_device_guard_enter(&g, d1));
    td_stream *s1 = default_stream(dev(-1));
    td_device_guard_exit(&g);
    td_stream *s2 = default_stream(dev(0));
    td_stream *s3 = default_stream(d1);

    check_device(td_stream_device(s0), d0);
    check_device(td_stream_device(s1), d1);
    check_device(td_stream_device(s2), d0);
    check_device(td_stream_device(s3), d1);
    TD_CHECK(td_stream_equal(s0, s2));
    TD_CHECK(td_stream_equal(s1, s3));
    TD_CHECK(!td_stream_equal(s0, s1));
    /* The default stream is the NULL stream (cuda_stream == 0) with id 0 and priority 0. */
    TD_CHECK(td_stream_native(s0) == NULL);
    TD_CHECK(td_stream_native(s1) == NULL);
    TD_CHECK_EQ(td_stream_id(s0), 0);
    TD_CHECK_EQ(td_stream_priority(s1), 0);

    TD_CHECK_OK(td_device_guard_enter(&g, d0));
    TD_CHECK(td_stream_equal(current_stream(dev(-1)), s0));
    td_device_guard_exit(&g);
    TD_CHECK_OK(td_device_guard_enter(&g, d1));
    TD_CHECK(td_stream_equal(current_stream(dev(-1)), s1));
    td_device_guard_exit(&g);

    /* Work on device 1's default stream: it runs and is waited for like any stream. */
    TD_CHECK_OK(td_stream_sleep(s3, FIFTY_MIL_CYCLES));
    TD_CHECK(!td_stream_query(s3));
    TD_CHECK_OK(td_stream_synchronize(s3));
    TD_CHECK(td_stream_query(s3));
    dev_teardown();
}

/* Device 0's default stream: the same asked for as the current device or by index, the NULL stream
 * with id and priority 0, current until another is set, and it runs work like any stream. */
TD_TEST(test_default_stream_one_device, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    td_stream *s0 = default_stream(dev(-1)), *s1 = default_stream(dev(0));
    check_device(td_stream_device(s0), dev(0));
    TD_CHECK(td_stream_equal(s0, s1));
    TD_CHECK(td_stream_native(s0) == NULL);
    TD_CHECK_EQ(td_stream_id(s0), 0);
    TD_CHECK_EQ(td_stream_priority(s0), 0);
    TD_CHECK(td_stream_equal(current_stream(dev(-1)), s0));

    TD_CHECK_OK(td_stream_sleep(s1, FIFTY_MIL_CYCLES));
    TD_CHECK(!td_stream_query(s1));
    TD_CHECK_OK(td_stream_synchronize(s1));
    TD_CHECK(td_stream_query(s1));

    td_stream *out = NULL;
    check_not_accelerator(td_stream_default(cpu_device(), &out), type);
    dev_teardown();
}

static void check_current(td_stream *want, int want_device, td_device_type type)
{
    TD_CHECK(td_stream_equal(current_stream((td_device){type, -1}), want));
    TD_CHECK_EQ(td_device_current(type), want_device);
}

/* Three nested stream guards (s0 and s2 on device 0, s1 on any): each sets its stream and its
 * device current, each exit restores what its entry saw. */
static void check_nested_stream_guards(td_stream *s0, td_stream *s1, td_stream *s2, td_device_type type)
{
    int d1 = td_stream_device(s1).index;
    td_stream_guard g1, g2, g3;
    TD_CHECK_OK(td_stream_guard_enter(&g1, s1));
    check_current(s1, d1, type);
    TD_CHECK_OK(td_stream_guard_enter(&g2, s2));
    check_current(s2, 0, type);
    TD_CHECK_OK(td_stream_guard_enter(&g3, s0));
    check_current(s0, 0, type);
    td_stream_guard_exit(&g3);
    check_current(s2, 0, type);
    td_stream_guard_exit(&g2);
    check_current(s1, d1, type);
    td_stream_guard_exit(&g1);
}

TD_TEST(test_stream_context, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 2);
    td_stream *s0 = current_stream(dev(-1));
    td_stream *s1 = new_stream(dev(1), 0);
    td_stream *s2 = new_stream(dev(0), 0);

    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, td_stream_device(s1)));
    td_stream *prev_stream_on_1 = current_stream(dev(-1));
    td_device_guard_exit(&g);
    check_current(s0, 0, type);

    check_nested_stream_guards(s0, s1, s2, type);
    td_stream_guard g1, g2;

    TD_CHECK_OK(td_device_guard_enter(&g, td_stream_device(s1)));
    TD_CHECK(td_stream_equal(prev_stream_on_1, current_stream(dev(-1))));
    td_device_guard_exit(&g);
    check_current(s0, 0, type);

    /* with stream(s2), stream(s1): both devices' current streams set, s1's device current. */
    TD_CHECK_OK(td_stream_guard_enter(&g1, s2));
    TD_CHECK_OK(td_stream_guard_enter(&g2, s1));
    TD_CHECK(td_stream_equal(current_stream(dev(0)), s2));
    TD_CHECK(td_stream_equal(current_stream(dev(1)), s1));
    TD_CHECK_EQ(td_device_current(type), 1);
    td_stream_guard_exit(&g2);
    TD_CHECK(td_stream_equal(current_stream(dev(0)), s2));
    TD_CHECK(td_stream_equal(current_stream(dev(1)), default_stream(dev(1))));
    TD_CHECK_EQ(td_device_current(type), 0);
    td_stream_guard_exit(&g1);
    TD_CHECK(td_stream_equal(current_stream(dev(0)), s0));
    TD_CHECK(td_stream_equal(current_stream(dev(1)), prev_stream_on_1));

    /* Exact restore of all three with non-default streams current and the other device current:
     * the device and both streams saved at entry come back, whatever was set inside. */
    td_stream *s3 = new_stream(dev(1), 0);
    TD_CHECK_OK(td_stream_set_current(s3)); /* dev 1's current stream; the current device stays 0 */
    TD_CHECK_EQ(td_device_current(type), 0);
    TD_CHECK_OK(td_stream_set_current(s2)); /* dev 0's */
    TD_CHECK_OK(td_device_set(dev(1)));
    td_stream *s4 = new_stream(dev(0), 0);
    TD_CHECK_OK(td_stream_guard_enter(&g1, s4));
    check_current(s4, 0, type);
    TD_CHECK(td_stream_equal(current_stream(dev(1)), s3));
    TD_CHECK_OK(td_device_set(dev(1)));
    TD_CHECK_OK(td_stream_set_current(s1));
    TD_CHECK_OK(td_stream_set_current(default_stream(dev(0))));
    td_stream_guard_exit(&g1);
    check_current(s3, 1, type);
    TD_CHECK(td_stream_equal(current_stream(dev(0)), s2));

    TD_CHECK_ERR(td_stream_guard_enter(&g1, NULL), TD_ERR_INVALID, NULL);
    td_stream_guard_exit(&g1); /* a failed enter leaves a guard whose exit does nothing */
    check_current(s3, 1, type);

    TD_CHECK_OK(td_stream_set_current(default_stream(dev(0))));
    TD_CHECK_OK(td_stream_set_current(default_stream(dev(1))));
    TD_CHECK_OK(td_device_set(dev(0)));
    td_stream_release(s4);
    td_stream_release(s3);
    td_stream_release(s2);
    td_stream_release(s1);
    TD_CHECK_EQ(live_streams(), 0);
    dev_teardown();
}

/* The stream guard on one device: nested guards set and restore device 0's current stream, a
 * guard restores the stream current at its entry whatever was set inside, and a failed enter
 * leaves a guard whose exit does nothing. */
TD_TEST(test_stream_context_one_device, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    td_stream *s0 = current_stream(dev(-1));
    td_stream *s1 = new_stream(dev(0), 0);
    td_stream *s2 = new_stream(dev(-1), 0);
    check_nested_stream_guards(s0, s1, s2, type);
    td_stream_guard g1;
    check_current(s0, 0, type);

    TD_CHECK_OK(td_stream_set_current(s2));
    TD_CHECK_OK(td_stream_guard_enter(&g1, s1));
    check_current(s1, 0, type);
    TD_CHECK_OK(td_stream_set_current(default_stream(dev(0))));
    td_stream_guard_exit(&g1);
    check_current(s2, 0, type);

    TD_CHECK_ERR(td_stream_guard_enter(&g1, NULL), TD_ERR_INVALID, NULL);
    td_stream_guard_exit(&g1);
    check_current(s2, 0, type);

    TD_CHECK_OK(td_stream_set_current(s0));
    td_stream_release(s2);
    td_stream_release(s1);
    TD_CHECK_EQ(live_streams(), 0);
    dev_teardown();
}

TD_TEST(test_streams_multi_gpu, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 2);
    (void)type;
    td_stream *def = current_stream(dev(-1));
    check_device(td_stream_device(def), dev(0));
    td_stream *stream = new_stream(dev(1), 0);
    check_device(td_stream_device(stream), dev(1));
    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, dev(1)));
    check_device(td_stream_device(current_stream(dev(-1))), dev(1));
    TD_CHECK(!td_stream_equal(current_stream(dev(-1)), def));
    /* Stream() with no device: the current one. */
    td_stream *here = new_stream(dev(-1), 0);
    check_device(td_stream_device(here), dev(1));
    td_device_guard_exit(&g);
    /* Created streams are distinct from each other and from the default stream. */
    TD_CHECK(!td_stream_equal(stream, here));
    TD_CHECK(!td_stream_equal(stream, default_stream(dev(1))));
    TD_CHECK(td_stream_id(stream) != 0);
    TD_CHECK(td_stream_native(stream) != NULL);
    td_stream_release(here);
    td_stream_release(stream);
    dev_teardown();
}

/* Created streams on one device: on the current device without one named, distinct from each
 * other and from the default stream, with a native handle and an id. */
TD_TEST(test_streams_one_device, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_stream *a = new_stream(dev(0), 0), *b = new_stream(dev(-1), 0);
    check_device(td_stream_device(a), dev(0));
    check_device(td_stream_device(b), dev(0));
    TD_CHECK(!td_stream_equal(a, b));
    TD_CHECK(!td_stream_equal(a, default_stream(dev(0))));
    TD_CHECK(td_stream_id(a) != 0 && td_stream_id(b) != 0 && td_stream_id(a) != td_stream_id(b));
    TD_CHECK(td_stream_native(a) != NULL);
    TD_CHECK(td_stream_native(a) != td_stream_native(b));
    td_stream_release(a);
    td_stream_release(b);
    dev_teardown();
}

/* Queries of device 0's streams: the default stream and a created one are busy behind a sleep
 * until synchronized. */
TD_TEST(test_streams_query_one_device, DEV_CASE)
{
    dev_setup(ctx, 1);
    TD_CHECK_OK(td_device_synchronize(dev(0)));
    td_stream *s0 = current_stream(dev(-1));
    td_stream *s1 = new_stream(dev(0), 0);
    TD_CHECK(td_stream_query(s0));
    TD_CHECK(td_stream_query(s1));
    TD_CHECK_OK(td_stream_sleep(NULL, FIFTY_MIL_CYCLES));
    TD_CHECK(!td_stream_query(s0));
    TD_CHECK_OK(td_stream_synchronize(s0));
    TD_CHECK(td_stream_query(s0));

    TD_CHECK_OK(td_stream_sleep(s1, FIFTY_MIL_CYCLES));
    TD_CHECK(!td_stream_query(s1));
    TD_CHECK_OK(td_stream_synchronize(s1));
    TD_CHECK(td_stream_query(s1));
    td_stream_release(s1);
    dev_teardown();
}

static void check_queries(td_stream *s0, bool want0, td_stream *s1, bool want1)
{
    td_device_guard g;
    for (int d = -1; d < 2; d++) { /* the current device as it is, then 0, then 1 */
        TD_CHECK_OK(td_device_guard_enter(&g, dev(d)));
        TD_CHECK_EQ(td_stream_query(s0), want0);
        TD_CHECK_EQ(td_stream_query(s1), want1);
        td_device_guard_exit(&g);
    }
}

TD_TEST(test_streams_multi_gpu_query, DEV_CASE)
{
    dev_setup(ctx, 2);
    TD_CHECK_OK(td_device_synchronize(dev(0)));
    TD_CHECK_OK(td_device_synchronize(dev(1)));
    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, dev(0)));
    td_stream *s0 = current_stream(dev(-1));
    td_device_guard_exit(&g);
    TD_CHECK_OK(td_device_guard_enter(&g, dev(1)));
    td_stream *s1 = current_stream(dev(-1));
    TD_CHECK_OK(td_stream_sleep(NULL, FIFTY_MIL_CYCLES)); /* the current stream of the current device */
    td_device_guard_exit(&g);

    check_queries(s0, true, s1, false);
    TD_CHECK_OK(td_device_guard_enter(&g, dev(0)));
    TD_CHECK_OK(td_stream_synchronize(s1)); /* from the other device, on purpose */
    td_device_guard_exit(&g);
    check_queries(s0, true, s1, true);

    /* The same with a created stream on device 1, synchronized from device 0. */
    td_stream *s2 = new_stream(dev(1), 0);
    TD_CHECK_OK(td_stream_sleep(s2, FIFTY_MIL_CYCLES));
    check_queries(s0, true, s2, false);
    TD_CHECK_OK(td_stream_synchronize(s2));
    check_queries(s0, true, s2, true);
    td_stream_release(s2);
    dev_teardown();
}

TD_TEST(test_streams_multi_gpu_eq, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, dev(0)));
    td_stream *s0 = current_stream(dev(-1));
    td_stream *s1 = current_stream(dev(-1));
    td_device_guard_exit(&g);
    TD_CHECK_OK(td_device_guard_enter(&g, dev(1)));
    td_stream *s2 = current_stream(dev(-1));
    td_stream *s3 = current_stream(dev(-1));
    td_device_guard_exit(&g);

    TD_CHECK(td_stream_equal(s0, s0));
    TD_CHECK(td_stream_equal(s0, s1));
    TD_CHECK(td_stream_equal(s2, s2));
    TD_CHECK(td_stream_equal(s2, s3));
    TD_CHECK(!td_stream_equal(s0, s2));
    TD_CHECK(!td_stream_equal(s1, s3));

    check_device(td_stream_device(s0), td_stream_device(s1));
    TD_CHECK(td_stream_native(s0) == td_stream_native(s1));
    check_device(td_stream_device(s2), td_stream_device(s3));
    TD_CHECK(td_stream_native(s2) == td_stream_native(s3));
    TD_CHECK(!td_device_equal(td_stream_device(s0), td_stream_device(s3)));
    /* Both raw handles are the NULL stream, yet the streams differ: equality includes the device. */
    TD_CHECK(td_stream_native(s0) == td_stream_native(s3));

    TD_CHECK_EQ(td_stream_hash(s0), td_stream_hash(s1));
    TD_CHECK_EQ(td_stream_hash(s2), td_stream_hash(s3));
    TD_CHECK(td_stream_hash(s0) != td_stream_hash(s3));

    /* Created streams: equal to themselves (and to a retained copy), not to each other. */
    td_stream *a = new_stream(dev(0), 0), *b = new_stream(dev(0), 0);
    td_stream *a2 = td_stream_retain(a);
    TD_CHECK(a2 == a);
    TD_CHECK(td_stream_equal(a, a2));
    TD_CHECK_EQ(td_stream_hash(a), td_stream_hash(a2));
    TD_CHECK(!td_stream_equal(a, b));
    TD_CHECK(!td_stream_equal(a, s0));
    TD_CHECK(!td_stream_equal(a, NULL));
    td_stream_release(a2);
    TD_CHECK_EQ(live_streams(), 2);
    td_stream_release(a);
    td_stream_release(b);
    TD_CHECK_EQ(live_streams(), 0);
    dev_teardown();
}

/* The priority range, a low-priority stream on device 0 and a high-priority one on device `other`
 * (device 0 too with one device), and priorities outside the range refused. */
static void streams_priority_case(td_test_ctx *ctx, int need)
{
    dev_setup(ctx, need);
    td_device other = dev(need - 1);
    int low = 1, high = 1;
    TD_CHECK_OK(td_stream_priority_range(dev(-1), &low, &high));
    TD_CHECK_EQ(low, 0);
    TD_CHECK(high <= -1);
    td_stream *s0 = new_stream(dev(0), low);
    TD_CHECK_EQ(td_stream_priority(s0), low);
    check_device(td_stream_device(s0), dev(0));
    td_stream *s1 = new_stream(other, high);
    TD_CHECK_EQ(td_stream_priority(s1), high);
    check_device(td_stream_device(s1), other);
    /* A high-priority stream runs work like any other. */
    TD_CHECK_OK(td_stream_sleep(s1, 1000));
    TD_CHECK_OK(td_stream_synchronize(s1));
    TD_CHECK(td_stream_query(s1));

    td_stream *out = NULL;
    TD_CHECK_ERR(td_stream_create(dev(0), low + 1, &out), TD_ERR_INVALID, "outside the device's range");
    TD_CHECK_ERR(td_stream_create(dev(0), high - 1, &out), TD_ERR_INVALID, "outside the device's range");
    TD_CHECK(out == NULL);
    int l = 0, h = 0;
    TD_CHECK_ERR(td_stream_priority_range(cpu_device(), &l, &h), TD_ERR_INVALID, "but got: cpu");
    TD_CHECK_EQ(live_streams(), 2);
    td_stream_release(s0);
    td_stream_release(s1);
    dev_teardown();
}

TD_TEST(test_streams_priority, DEV_CASE) { streams_priority_case(ctx, 2); }
TD_TEST(test_streams_priority_one_device, DEV_CASE) { streams_priority_case(ctx, 1); }

/* ---- events -------------------------------------------------------------------------------- */

TD_TEST(test_stream_event_device, DEV_CASE)
{
    dev_setup(ctx, 2);
    /* (Before its first record: test_stream_event_device_one_device.) */
    td_event *e0 = new_event(TD_EVENT_DEFAULT);

    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, dev(0)));
    td_stream *s0 = current_stream(dev(-1));
    TD_CHECK_OK(td_event_record(e0, s0));
    td_device_guard_exit(&g);

    TD_CHECK_OK(td_device_guard_enter(&g, dev(1)));
    td_stream *s1 = new_stream(dev(-1), 0);
    td_event *e1 = new_event(TD_EVENT_DEFAULT);
    TD_CHECK_OK(td_event_record(e1, s1));
    td_device_guard_exit(&g);

    check_device(td_stream_device(s0), dev(0));
    check_device(td_event_device(e0), dev(0));
    check_device(td_stream_device(s1), dev(1));
    check_device(td_event_device(e1), dev(1));

    /* A NULL stream records on the current stream of the current device. */
    td_event *e2 = new_event(TD_EVENT_DEFAULT);
    TD_CHECK_OK(td_device_guard_enter(&g, dev(1)));
    TD_CHECK_OK(td_event_record(e2, NULL));
    td_device_guard_exit(&g);
    check_device(td_event_device(e2), dev(1));

    /* The event stays on its device: recording on another device's stream fails and changes
     * nothing; its own device works from any current device. */
    TD_CHECK_ERR(td_event_record(e0, s1), TD_ERR_INVALID,
                 "Event device 0 does not match recording stream's device 1.");
    check_device(td_event_device(e0), dev(0));
    TD_CHECK_ERR(td_event_record(e1, s0), TD_ERR_INVALID,
                 "Event device 1 does not match recording stream's device 0.");
    TD_CHECK_OK(td_device_guard_enter(&g, dev(0)));
    TD_CHECK_ERR(td_event_record(e2, NULL), TD_ERR_INVALID, "does not match recording stream's device 0.");
    TD_CHECK_OK(td_event_record(e1, s1));
    td_device_guard_exit(&g);
    TD_CHECK_OK(td_event_synchronize(e1));
    TD_CHECK(td_event_query(e1));

    td_event_release(e0);
    td_event_release(e1);
    td_event_release(e2);
    td_stream_release(s1);
    dev_teardown();
}

/* An event's device on one device: none before the first record (and done, waiting for nothing),
 * then the recording stream's, a NULL stream meaning the current one; re-recording on its device. */
TD_TEST(test_stream_event_device_one_device, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_event *e0 = new_event(TD_EVENT_DEFAULT);
    TD_CHECK_EQ(td_event_device(e0).index, -1);
    /* Before its first record an event is done and waits for nothing. */
    TD_CHECK(td_event_query(e0));
    TD_CHECK_OK(td_event_synchronize(e0));
    TD_CHECK_OK(td_stream_wait_event(NULL, e0));
    TD_CHECK_EQ(td_event_device(e0).index, -1);
    td_stream *s1 = new_stream(dev(0), 0);
    TD_CHECK_OK(td_event_record(e0, s1));
    check_device(td_event_device(e0), dev(0));
    td_event *e1 = new_event(TD_EVENT_DEFAULT);
    TD_CHECK_OK(td_event_record(e1, NULL));
    check_device(td_event_device(e1), dev(0));
    TD_CHECK_OK(td_stream_sleep(s1, FIFTY_MIL_CYCLES));
    TD_CHECK_OK(td_event_record(e0, s1));
    TD_CHECK(!td_event_query(e0));
    TD_CHECK_OK(td_event_synchronize(e0));
    TD_CHECK(td_event_query(e0));
    TD_CHECK_OK(td_event_synchronize(e1));
    td_event_release(e0);
    td_event_release(e1);
    td_stream_release(s1);
    dev_teardown();
}

/* test_events_wait: a stream of device `other` waits for an event of device 0's current stream,
 * then for all that stream has queued (wait_stream). With one device, other is device 0 and the
 * waiting streams are created ones. */
static void events_wait_case(td_test_ctx *ctx, int need)
{
    dev_setup(ctx, need);
    td_device other = dev(need - 1);
    TD_CHECK_OK(td_device_synchronize(dev(0)));
    TD_CHECK_OK(td_device_synchronize(other));
    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, dev(0)));
    td_stream *s0 = current_stream(dev(-1));
    TD_CHECK_OK(td_stream_sleep(NULL, FIFTY_MIL_CYCLES));
    td_event *e0 = new_event(TD_EVENT_DEFAULT);
    TD_CHECK_OK(td_event_record(e0, s0));
    td_device_guard_exit(&g);
    td_stream *created = other.index == 0 ? new_stream(other, 0) : NULL;
    TD_CHECK_OK(td_device_guard_enter(&g, other));
    td_stream *s1 = created ? created : current_stream(dev(-1));
    td_device_guard_exit(&g);

    TD_CHECK(!td_stream_query(s0));
    TD_CHECK(td_stream_query(s1));
    TD_CHECK(!td_event_query(e0));

    TD_CHECK_OK(td_stream_wait_event(s1, e0));
    TD_CHECK_OK(td_stream_synchronize(s1));
    TD_CHECK(td_event_query(e0));
    TD_CHECK(td_stream_query(s0));
    TD_CHECK(td_stream_query(s1));

    /* wait_stream: other's new stream waits for everything queued on device 0 so far. */
    td_stream *s2 = new_stream(other, 0);
    TD_CHECK_OK(td_stream_sleep(s0, FIFTY_MIL_CYCLES));
    TD_CHECK_OK(td_stream_wait_stream(s2, s0));
    TD_CHECK(!td_stream_query(s0));
    TD_CHECK_OK(td_stream_synchronize(s2));
    TD_CHECK(td_stream_query(s0));
    TD_CHECK(td_stream_query(s2));
    td_stream_release(s2);
    if (created)
        td_stream_release(created);
    td_event_release(e0);
    dev_teardown();
}

TD_TEST(test_events_wait, DEV_CASE) { events_wait_case(ctx, 2); }
TD_TEST(test_events_wait_one_device, DEV_CASE) { events_wait_case(ctx, 1); }

static void check_event_queries(td_event *e0, bool want0, td_event *e1, bool want1)
{
    td_device_guard g;
    for (int d = -1; d < 2; d++) {
        TD_CHECK_OK(td_device_guard_enter(&g, dev(d)));
        TD_CHECK_EQ(td_event_query(e0), want0);
        TD_CHECK_EQ(td_event_query(e1), want1);
        td_device_guard_exit(&g);
    }
}

TD_TEST(test_events_multi_gpu_query, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, dev(0)));
    td_stream *s0 = current_stream(dev(-1));
    td_event *e0 = new_event(TD_EVENT_DEFAULT);
    TD_CHECK_OK(td_event_record(e0, s0));
    TD_CHECK_OK(td_stream_synchronize(s0));
    td_device_guard_exit(&g);
    TD_CHECK_OK(td_device_guard_enter(&g, dev(1)));
    td_stream *s1 = current_stream(dev(-1));
    TD_CHECK_OK(td_stream_sleep(NULL, FIFTY_MIL_CYCLES));
    td_event *e1 = new_event(TD_EVENT_DEFAULT);
    TD_CHECK_OK(td_event_record(e1, s1));
    td_device_guard_exit(&g);

    check_event_queries(e0, true, e1, false);
    TD_CHECK_OK(td_device_guard_enter(&g, dev(0)));
    TD_CHECK_OK(td_event_synchronize(e1)); /* from the other device, on purpose */
    td_device_guard_exit(&g);
    check_event_queries(e0, true, e1, true);

    /* A re-record captures the new work: the event is pending again until it is done. */
    TD_CHECK_OK(td_stream_sleep(s1, FIFTY_MIL_CYCLES));
    TD_CHECK_OK(td_event_record(e1, s1));
    check_event_queries(e0, true, e1, false);
    TD_CHECK_OK(td_event_synchronize(e1));
    check_event_queries(e0, true, e1, true);
    td_event_release(e0);
    td_event_release(e1);
    dev_teardown();
}

/* Event queries on one device: done once synchronized, pending behind a sleep, and pending again
 * after a re-record captures new work. */
TD_TEST(test_events_query_one_device, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_stream *s0 = current_stream(dev(-1));
    td_stream *s1 = new_stream(dev(0), 0);
    td_event *e0 = new_event(TD_EVENT_DEFAULT), *e1 = new_event(TD_EVENT_DEFAULT);
    TD_CHECK_OK(td_event_record(e0, s0));
    TD_CHECK_OK(td_stream_synchronize(s0));
    TD_CHECK_OK(td_stream_sleep(s1, FIFTY_MIL_CYCLES));
    TD_CHECK_OK(td_event_record(e1, s1));
    TD_CHECK(td_event_query(e0));
    TD_CHECK(!td_event_query(e1));
    TD_CHECK_OK(td_event_synchronize(e1));
    TD_CHECK(td_event_query(e1));
    TD_CHECK_OK(td_stream_sleep(s1, FIFTY_MIL_CYCLES));
    TD_CHECK_OK(td_event_record(e1, s1));
    TD_CHECK(!td_event_query(e1));
    TD_CHECK_OK(td_event_synchronize(e1));
    TD_CHECK(td_event_query(e1));
    TD_CHECK(td_event_query(e0));
    td_event_release(e0);
    td_event_release(e1);
    td_stream_release(s1);
    dev_teardown();
}

TD_TEST(test_events_multi_gpu_elapsed_time, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_device_guard g;
    float ms = -1;
    TD_CHECK_OK(td_device_guard_enter(&g, dev(0)));
    td_stream *s0 = current_stream(dev(-1));
    td_event *e0 = new_event(TD_EVENT_ENABLE_TIMING);
    TD_CHECK_OK(td_stream_sleep(NULL, 10));
    TD_CHECK_OK(td_event_record(e0, s0));
    td_device_guard_exit(&g);

    /* Not yet recorded. */
    td_event *e1 = new_event(TD_EVENT_ENABLE_TIMING);
    TD_CHECK_ERR(td_event_elapsed_time(e0, e1, &ms), TD_ERR_INVALID,
                 "Both events must be recorded before calculating elapsed time.");
    TD_CHECK_ERR(td_event_elapsed_time(e1, e0, &ms), TD_ERR_INVALID,
                 "Both events must be recorded before calculating elapsed time.");

    TD_CHECK_OK(td_device_guard_enter(&g, dev(1)));
    td_stream *s1 = current_stream(dev(-1));
    TD_CHECK_OK(td_stream_sleep(NULL, FIFTY_MIL_CYCLES));
    TD_CHECK_OK(td_event_record(e1, s1));
    td_device_guard_exit(&g);
    TD_CHECK_OK(td_event_synchronize(e0));
    TD_CHECK_OK(td_event_synchronize(e1));

    /* Different devices: an error, whatever the current device. */
    for (int d = 0; d < 2; d++) {
        TD_CHECK_OK(td_device_guard_enter(&g, dev(d)));
        TD_CHECK_ERR(td_event_elapsed_time(e0, e1, &ms), TD_ERR_INVALID, "invalid resource handle");
        td_device_guard_exit(&g);
    }

    TD_CHECK_OK(td_device_guard_enter(&g, dev(0)));
    s0 = current_stream(dev(-1));
    td_event *e2 = new_event(TD_EVENT_ENABLE_TIMING);
    TD_CHECK_OK(td_stream_sleep(NULL, FIFTY_MIL_CYCLES));
    TD_CHECK_OK(td_event_record(e2, s0));
    TD_CHECK_OK(td_stream_synchronize(s0));
    td_device_guard_exit(&g);

    ms = -1;
    TD_CHECK_OK(td_event_elapsed_time(e0, e2, &ms));
    TD_CHECK_MSG(ms > 0, "elapsed %g ms", (double)ms);
    TD_CHECK_OK(td_device_guard_enter(&g, dev(1))); /* from the other device, on purpose */
    float ms2 = -1;
    TD_CHECK_OK(td_event_elapsed_time(e0, e2, &ms2));
    TD_CHECK_MSG(ms2 > 0, "elapsed %g ms", (double)ms2);
    td_device_guard_exit(&g);
    TD_CHECK(ms == ms2);
    td_event_release(e0);
    td_event_release(e1);
    td_event_release(e2);
    dev_teardown();
}

/* Elapsed time on one device: both events must be recorded, it spans a sleep, and timing-disabled
 * events (the default) have none. */
TD_TEST(test_event_elapsed_time_one_device, DEV_CASE)
{
    dev_setup(ctx, 1);
    float ms = -1;
    td_stream *s0 = current_stream(dev(-1));
    td_event *e0 = new_event(TD_EVENT_ENABLE_TIMING), *e1 = new_event(TD_EVENT_ENABLE_TIMING);
    TD_CHECK_OK(td_stream_sleep(NULL, 10));
    TD_CHECK_OK(td_event_record(e0, s0));
    TD_CHECK_ERR(td_event_elapsed_time(e0, e1, &ms), TD_ERR_INVALID,
                 "Both events must be recorded before calculating elapsed time.");
    TD_CHECK_ERR(td_event_elapsed_time(e1, e0, &ms), TD_ERR_INVALID,
                 "Both events must be recorded before calculating elapsed time.");
    TD_CHECK_OK(td_stream_sleep(NULL, FIFTY_MIL_CYCLES));
    TD_CHECK_OK(td_event_record(e1, s0));
    TD_CHECK_OK(td_event_synchronize(e1));
    TD_CHECK_OK(td_event_elapsed_time(e0, e1, &ms));
    TD_CHECK_MSG(ms > 0, "elapsed %g ms", (double)ms);

    /* Timing disabled (the default): recorded, but no elapsed time. */
    td_event *n0 = new_event(TD_EVENT_DEFAULT), *n1 = new_event(TD_EVENT_DEFAULT);
    TD_CHECK_OK(td_event_record(n0, s0));
    TD_CHECK_OK(td_event_record(n1, s0));
    TD_CHECK_OK(td_event_synchronize(n1));
    TD_CHECK_ERR(td_event_elapsed_time(n0, n1, &ms), TD_ERR_INVALID,
                 "Both events must be created with argument 'enable_timing=True'.");
    TD_CHECK_ERR(td_event_elapsed_time(e0, n1, &ms), TD_ERR_INVALID, "enable_timing=True");
    td_event_release(n0);
    td_event_release(n1);
    td_event_release(e0);
    td_event_release(e1);
    dev_teardown();
}

/* Interprocess events: no timing, a handle only once recorded, and only with the flag. */
TD_TEST(test_event_interprocess_flags, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    td_event *e = NULL;
    TD_CHECK_ERR(td_event_create(TD_EVENT_INTERPROCESS | TD_EVENT_ENABLE_TIMING, &e), TD_ERR_INVALID,
                 "interprocess event cannot have timing enabled");
    TD_CHECK_ERR(td_event_create(8, &e), TD_ERR_INVALID, "unknown flags");
    TD_CHECK(e == NULL);
    td_device_live live;
    td_device_live_get(&live);
    TD_CHECK_EQ(live.events, 0);

    td_event *ipc = new_event(TD_EVENT_INTERPROCESS | TD_EVENT_BLOCKING);
    td_event *plain = new_event(TD_EVENT_DEFAULT);
    td_event_ipc_handle handle;
    /* Never recorded: created on the current device when its handle is taken, as torch's lazy
     * events (test_event_handle_multi_gpu). */
    TD_CHECK_OK(td_event_ipc_handle_get(ipc, &handle));
    TD_CHECK(td_device_equal(td_event_device(ipc), dev(0)));
    TD_CHECK_ERR(td_event_ipc_handle_get(plain, &handle), TD_ERR_INVALID, "interprocess");

    td_stream *s = current_stream(dev(0));
    TD_CHECK_OK(td_stream_sleep(s, FIFTY_MIL_CYCLES));
    TD_CHECK_OK(td_event_record(ipc, s));
    TD_CHECK_OK(td_event_record(plain, s));
    TD_CHECK_ERR(td_event_ipc_handle_get(plain, &handle), TD_ERR_INVALID, "interprocess");
    /* It orders work like any event... */
    TD_CHECK(!td_event_query(ipc));
    TD_CHECK_OK(td_event_synchronize(ipc));
    TD_CHECK(td_event_query(ipc));
    /* ...but has no timing. */
    float ms = 0;
    TD_CHECK_ERR(td_event_elapsed_time(ipc, ipc, &ms), TD_ERR_INVALID, "enable_timing=True");
    (void)type;
    TD_CHECK_OK(td_event_ipc_handle_get(ipc, &handle));
    td_event_release(ipc);
    td_event_release(plain);
    dev_teardown();
}

/* ---- external streams ---------------------------------------------------------------------- */

/* Wraps a native stream created on device index `on` (as foreign code would), with the wrapper's
 * device given as `as` (index -1: the current device, which the caller set to `on`). */
static void external_stream_case(int on, td_device as)
{
    const device_impl *impl = device_impl_of(dev(0).type);
    TD_CHECK(impl != NULL);
    void *native = NULL;
    TD_CHECK_OK(impl->stream_create(on, 0, &native));
    TD_CHECK(native != NULL);

    td_stream *ext = NULL;
    TD_CHECK_OK(td_stream_from_external(native, as, &ext));
    TD_CHECK(td_stream_native(ext) == native);
    TD_CHECK_EQ(td_stream_device(ext).index, on);
    TD_CHECK_EQ(td_stream_device(ext).type, dev(0).type);
    TD_CHECK_EQ(live_streams(), 1);

    /* Two wrappers of one handle are the same stream; not the default one. */
    td_stream *again = NULL;
    TD_CHECK_OK(td_stream_from_external(native, dev(on), &again));
    TD_CHECK(td_stream_equal(ext, again));
    TD_CHECK_EQ(td_stream_hash(ext), td_stream_hash(again));
    TD_CHECK(!td_stream_equal(ext, default_stream(dev(on))));
    td_stream_release(again);

    /* Work through the wrapper runs on the native stream. */
    TD_CHECK_OK(td_stream_sleep(ext, FIFTY_MIL_CYCLES));
    TD_CHECK(!td_stream_query(ext));
    TD_CHECK_EQ(impl->stream_query(on, native), 0);
    TD_CHECK_OK(td_stream_synchronize(ext));
    TD_CHECK_EQ(impl->stream_query(on, native), 1);

    /* Releasing the wrapper leaves the native stream alive: the owner still uses and destroys it. */
    td_stream_release(ext);
    TD_CHECK_EQ(live_streams(), 0);
    TD_CHECK_OK(impl->sleep(on, 1000, native));
    TD_CHECK_OK(impl->stream_synchronize(on, native));
    TD_CHECK_EQ(impl->stream_query(on, native), 1);
    impl->stream_destroy(on, native);

    TD_CHECK_ERR(td_stream_from_external(NULL, as, &ext), TD_ERR_INVALID, "must not be NULL");
}

TD_TEST(test_external_streams, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, dev(0)));
    external_stream_case(0, dev(-1));
    td_device_guard_exit(&g);
    dev_teardown();
}

TD_TEST(test_external_streams_multi_device, DEV_CASE)
{
    dev_setup(ctx, 2);
    /* The device is named explicitly while another is current. */
    TD_CHECK_EQ(td_device_current(dev(0).type), 0);
    external_stream_case(1, dev(1));
    /* And with no device, the current one. */
    td_device_guard g;
    TD_CHECK_OK(td_device_guard_enter(&g, dev(1)));
    external_stream_case(1, dev(-1));
    td_device_guard_exit(&g);
    dev_teardown();
}

/* ---- threads ------------------------------------------------------------------------------- */

/* The seed's three timed waits: tik is recorded on the current stream, `wait` queues the spin and
 * blocks in its own way until tok (recorded on that stream last) is done, and *ms is tik to tok. */
static td_status timed_wait(float *ms, unsigned flags, td_status (*wait)(td_stream *s, td_event *tok))
{
    td_stream *s = NULL;
    td_device cur = {td_device_default_type(), -1};
    TD_TRY(td_stream_current(cur, &s));
    td_event *tik = NULL, *tok = NULL;
    td_status st = td_event_create(flags | TD_EVENT_ENABLE_TIMING, &tik);
    if (st == TD_OK)
        st = td_event_create(flags | TD_EVENT_ENABLE_TIMING, &tok);
    if (st == TD_OK)
        st = td_event_record(tik, s);
    if (st == TD_OK)
        st = wait(s, tok);
    if (st == TD_OK)
        st = td_event_elapsed_time(tik, tok, ms);
    td_event_release(tik);
    td_event_release(tok);
    return st;
}

/* _stream_synchronize and _event_synchronize: spin on the current stream s, then block in stream
 * synchronize or in event synchronize of tok, s's last event. */
static td_status spin_then_synchronize(td_stream *s, td_event *tok, bool on_event)
{
    td_status st = td_stream_sleep(NULL, FIFTY_MIL_CYCLES);
    if (st == TD_OK)
        st = td_event_record(tok, s);
    if (st == TD_OK)
        st = on_event ? td_event_synchronize(tok) : td_stream_synchronize(s);
    if (st == TD_OK && !td_stream_query(s))
        st = error_set(TD_ERR_INTERNAL, on_event ? "the stream is busy after its last event's synchronize"
                                                 : "the stream is busy after its synchronize");
    return st;
}

static td_status stream_synchronize_wait(td_stream *s, td_event *tok) { return spin_then_synchronize(s, tok, false); }
static td_status event_synchronize_wait(td_stream *s, td_event *tok) { return spin_then_synchronize(s, tok, true); }

/* _event_wait: spin on s0, a second stream waits for it (blocking events), then both are awaited. */
static td_status event_wait_wait(td_stream *s0, td_event *tok)
{
    td_stream *s1 = NULL;
    td_event *sync = NULL;
    TD_TRY(td_stream_create(td_stream_device(s0), 0, &s1));
    td_status st = td_event_create(TD_EVENT_BLOCKING, &sync);
    if (st == TD_OK)
        st = td_stream_sleep(NULL, FIFTY_MIL_CYCLES - 10);
    if (st == TD_OK)
        st = td_event_record(sync, NULL);
    if (st == TD_OK)
        st = td_stream_wait_event(s1, sync);
    if (st == TD_OK) {
        td_stream_guard g;
        st = td_stream_guard_enter(&g, s1);
        if (st == TD_OK) {
            st = td_stream_sleep(NULL, 10);
            td_stream_guard_exit(&g);
        }
    }
    if (st == TD_OK)
        st = td_stream_synchronize(s1);
    if (st == TD_OK)
        st = td_event_record(tok, NULL);
    if (st == TD_OK)
        st = td_event_synchronize(tok);
    if (st == TD_OK && (!td_stream_query(s0) || !td_stream_query(s1) || !td_event_query(sync)))
        st = error_set(TD_ERR_INTERNAL, "a stream or the sync event is busy after the waits");
    td_event_release(sync);
    td_stream_release(s1);
    return st;
}

typedef td_status (*sync_func)(float *ms);

static td_status stream_synchronize_func(float *ms) { return timed_wait(ms, TD_EVENT_DEFAULT, stream_synchronize_wait); }
static td_status event_synchronize_func(float *ms) { return timed_wait(ms, TD_EVENT_DEFAULT, event_synchronize_wait); }
static td_status event_wait_func(float *ms) { return timed_wait(ms, TD_EVENT_BLOCKING, event_wait_wait); }

typedef struct nogil_child {
    sync_func fn;
    sem_t c2p, p2c;
    td_status status;
    int current_before; /* the child's current device before its own guard */
    float ms;
    char error[256];
} nogil_child;

static void *nogil_child_main(void *arg)
{
    nogil_child *c = arg;
    c->current_before = td_device_current(td_device_default_type());
    td_device_guard g;
    c->status = td_device_guard_enter(&g, dev(1));
    sem_post(&c->c2p);
    sem_wait(&c->p2c);
    if (c->status == TD_OK)
        c->status = c->fn(&c->ms);
    if (c->status != TD_OK)
        snprintf(c->error, sizeof c->error, "%s", td_last_error());
    td_device_guard_exit(&g);
    sem_post(&c->c2p);
    return NULL;
}

TD_TEST(test_stream_event_nogil, DEV_CASE, .timeout_s = 120)
{
    td_device_type type = dev_setup(ctx, 2);
    static const struct {
        const char *name;
        sync_func fn;
    } funcs[] = {{"stream_synchronize", stream_synchronize_func},
                 {"event_synchronize", event_synchronize_func},
                 {"event_wait", event_wait_func}};
    for (size_t i = 0; i < sizeof funcs / sizeof funcs[0]; i++) {
        nogil_child c;
        memset(&c, 0, sizeof c);
        c.fn = funcs[i].fn;
        c.current_before = -1;
        TD_CHECK_EQ(sem_init(&c.c2p, 0, 0), 0);
        TD_CHECK_EQ(sem_init(&c.p2c, 0, 0), 0);
        td_event *tik = new_event(TD_EVENT_ENABLE_TIMING), *tok = new_event(TD_EVENT_ENABLE_TIMING);
        pthread_t t;
        TD_CHECK_EQ(pthread_create(&t, NULL, nogil_child_main, &c), 0);
        sem_wait(&c.c2p); /* the child is on device 1 */
        td_device_guard g;
        TD_CHECK_OK(td_device_guard_enter(&g, dev(0)));
        TD_CHECK_OK(td_event_record(tik, NULL));
        sem_post(&c.p2c);
        float parent_ms = 0;
        td_status parent_status = funcs[i].fn(&parent_ms);
        char parent_error[256];
        snprintf(parent_error, sizeof parent_error, "%s", td_last_error());
        sem_wait(&c.c2p);
        TD_CHECK_OK(td_event_record(tok, NULL));
        TD_CHECK_OK(td_event_synchronize(tok));
        float total_ms = 0;
        TD_CHECK_OK(td_event_elapsed_time(tik, tok, &total_ms));
        td_device_guard_exit(&g);
        TD_CHECK_EQ(pthread_join(t, NULL), 0);
        sem_destroy(&c.c2p);
        sem_destroy(&c.p2c);
        td_event_release(tik);
        td_event_release(tok);

        TD_CHECK_MSG(parent_status == TD_OK, "%s in the parent: %s", funcs[i].name, parent_error);
        TD_CHECK_MSG(c.status == TD_OK, "%s in the child: %s", funcs[i].name, c.error);
        /* The child's thread started on device 0, and its guard did not move the parent. */
        TD_CHECK_EQ(c.current_before, 0);
        TD_CHECK_EQ(td_device_current(type), 0);
        TD_CHECK_MSG(parent_ms > 0 && c.ms > 0, "%s: parent %g ms, child %g ms", funcs[i].name, (double)parent_ms,
                     (double)c.ms);
        /* The two blocking waits overlapped: their sum is well over the span that held both. */
        TD_CHECK_MSG(parent_ms + c.ms > total_ms * 1.4f, "%s: parent %.2f ms + child %.2f ms <= 1.4 * total %.2f ms",
                     funcs[i].name, (double)parent_ms, (double)c.ms, (double)total_ms);
    }
    dev_teardown();
}

/* The seed's nogil check measures device time, which a library lock taken only by the blocking
 * waits does not disturb (the child's work is queued without it). Here the order of the waits'
 * returns tells: the parent blocks first on 50M cycles of device 0, the child then waits for 5M
 * cycles of device 1 in the same kind of wait, and must return first. */
typedef enum wait_kind { WAIT_STREAM = 0, WAIT_EVENT, WAIT_DEVICE, WAIT_KINDS } wait_kind;

static td_status queue_and_wait(td_device d, int64_t cycles, wait_kind kind, void (*before_wait)(void *), void *arg)
{
    td_stream *s = NULL;
    TD_TRY(td_stream_current(d, &s));
    td_event *e = NULL;
    TD_TRY(td_event_create(TD_EVENT_BLOCKING, &e));
    td_status st = td_stream_sleep(s, cycles);
    if (st == TD_OK)
        st = td_event_record(e, s);
    if (before_wait)
        before_wait(arg);
    if (st == TD_OK) {
        if (kind == WAIT_STREAM)
            st = td_stream_synchronize(s);
        else if (kind == WAIT_EVENT)
            st = td_event_synchronize(e);
        else
            st = td_device_synchronize(d);
    }
    if (st == TD_OK && !td_event_query(e))
        st = error_set(TD_ERR_INTERNAL, "the wait returned before the work was done");
    td_event_release(e);
    return st;
}

typedef struct order_child {
    wait_kind kind;
    sem_t go;
    atomic_int *returns; /* how many waits have returned, parent's and child's */
    int position;        /* 1: the child's wait returned first */
    td_status status;
    char error[256];
} order_child;

static void *order_child_main(void *arg)
{
    order_child *c = arg;
    sem_wait(&c->go);
    c->status = queue_and_wait(dev(1), FIFTY_MIL_CYCLES / 10, c->kind, NULL, NULL);
    c->position = atomic_fetch_add(c->returns, 1) + 1;
    if (c->status != TD_OK)
        snprintf(c->error, sizeof c->error, "%s", td_last_error());
    return NULL;
}

static void post_go(void *arg) { sem_post(arg); }

TD_TEST(test_blocking_waits_hold_no_lock, DEV_CASE)
{
    dev_setup(ctx, 2);
    static const char *const names[] = {"stream synchronize", "event synchronize", "device synchronize"};
    for (int kind = 0; kind < WAIT_KINDS; kind++) {
        atomic_int returns = 0;
        order_child c;
        memset(&c, 0, sizeof c);
        c.kind = (wait_kind)kind;
        c.returns = &returns;
        TD_CHECK_EQ(sem_init(&c.go, 0, 0), 0);
        pthread_t t;
        TD_CHECK_EQ(pthread_create(&t, NULL, order_child_main, &c), 0);
        /* The child starts once the parent's 50M cycles are queued, just before the parent waits. */
        td_status st = queue_and_wait(dev(0), FIFTY_MIL_CYCLES, (wait_kind)kind, post_go, &c.go);
        int parent_position = atomic_fetch_add(&returns, 1) + 1;
        char parent_error[256];
        snprintf(parent_error, sizeof parent_error, "%s", td_last_error());
        TD_CHECK_EQ(pthread_join(t, NULL), 0);
        sem_destroy(&c.go);
        TD_CHECK_MSG(st == TD_OK, "%s in the parent: %s", names[kind], parent_error);
        TD_CHECK_MSG(c.status == TD_OK, "%s in the child: %s", names[kind], c.error);
        TD_CHECK_MSG(c.position == 1 && parent_position == 2,
                     "%s: the child's short wait on device 1 returned after the parent's long wait on device 0",
                     names[kind]);
    }
    dev_teardown();
}

typedef struct race_worker {
    int index;
    pthread_barrier_t *barrier;
    td_status status;
    char error[256];
    td_tensor *out;
    void *block;
} race_worker;

static void *race_main(void *arg)
{
    race_worker *w = arg;
    td_tensor *host = NULL;
    td_status st = td_tensor_full(TD_FLOAT32, TD_SHAPE(1), 1.0, &host);
    pthread_barrier_wait(w->barrier);
    /* The first device use of the process (after counting devices), on two devices at once. */
    if (st == TD_OK)
        st = td_tensor_to_device(host, dev(w->index), false, &w->out);
    if (st == TD_OK)
        st = td_device_malloc(dev(w->index), 4096, NULL, &w->block);
    if (st == TD_OK)
        st = td_device_set(dev(w->index));
    if (st == TD_OK)
        st = td_stream_sleep(NULL, 1000);
    if (st == TD_OK)
        st = td_device_synchronize(dev(-1));
    if (st != TD_OK)
        snprintf(w->error, sizeof w->error, "%s", td_last_error());
    w->status = st;
    td_tensor_release(host);
    return NULL;
}

/* torch.tensor([1.]).cuda(rank) on two threads as the first device use of a fresh process (the
 * body runs in one; on cuda the set-up has opened the driver already, so that its fds and threads
 * are in the leak baseline); then again after each shutdown, which restarts the runtime lazily. */
TD_TEST(test_cuda_init_race, DEV_CASE)
{
    dev_setup(ctx, 2);
    for (int round = 0; round < 8; round++) {
        pthread_barrier_t barrier;
        TD_CHECK_EQ(pthread_barrier_init(&barrier, NULL, 2), 0);
        race_worker w[2];
        memset(w, 0, sizeof w);
        pthread_t t[2];
        for (int i = 0; i < 2; i++) {
            w[i].index = i;
            w[i].barrier = &barrier;
            TD_CHECK_EQ(pthread_create(&t[i], NULL, race_main, &w[i]), 0);
        }
        for (int i = 0; i < 2; i++)
            TD_CHECK_EQ(pthread_join(t[i], NULL), 0);
        pthread_barrier_destroy(&barrier);
        for (int i = 0; i < 2; i++) {
            TD_CHECK_MSG(w[i].status == TD_OK, "round %d, device %d: %s", round, i, w[i].error);
            check_device(td_tensor_device(w[i].out), dev(i));
            TD_CHECK_EQ(dev_get(w[i].out, 0), 1.0);
            td_tensor_release(w[i].out);
            td_device_free(w[i].block);
        }
        /* The threads' current devices were their own. */
        TD_CHECK_EQ(td_device_current(dev(0).type), 0);
        td_device_live live;
        td_device_live_get(&live);
        TD_CHECK_EQ(live.streams, 0);
        TD_CHECK_OK(td_device_shutdown());
    }
    dev_teardown();
}

typedef struct own_child {
    td_stream *parent_stream; /* the parent's current stream on device 0 (borrowed) */
    int ndevices;
    bool started_on_default, parent_unchanged_seen;
    int started_device;
    td_status status;
    char error[256];
} own_child;

static void *own_child_main(void *arg)
{
    own_child *c = arg;
    td_device_type type = dev(0).type;
    td_stream *cur = NULL;
    c->status = td_stream_current(dev(0), &cur);
    if (c->status != TD_OK)
        goto out;
    /* A new thread starts on device 0 with default streams, whatever its parent set. */
    c->started_on_default = td_stream_id(cur) == 0 && !td_stream_equal(cur, c->parent_stream);
    c->started_device = td_device_current(type);
    td_stream *mine = NULL;
    c->status = td_stream_create(dev(0), 0, &mine);
    if (c->status != TD_OK)
        goto out;
    c->status = td_stream_set_current(mine);
    td_stream_release(mine); /* current: the thread's slot keeps it */
    if (c->status == TD_OK && c->ndevices >= 2)
        c->status = td_device_set(dev(1));
    if (c->status == TD_OK)
        c->status = td_stream_sleep(NULL, 1000);
    if (c->status == TD_OK)
        c->status = td_stream_synchronize(NULL);
out:
    if (c->status != TD_OK)
        snprintf(c->error, sizeof c->error, "%s", td_last_error());
    return NULL; /* the thread's current stream is released at its exit */
}

/* A thread's current device and streams are its own: a child's set_current and set_device do not
 * change the parent's, and the child starts from device 0's default stream. */
TD_TEST(test_thread_current_streams_own, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    int n = td_device_count(type);
    td_stream *s = new_stream(dev(0), 0);
    TD_CHECK_OK(td_stream_set_current(s));
    if (n >= 2)
        TD_CHECK_OK(td_device_set(dev(1)));
    own_child c;
    memset(&c, 0, sizeof c);
    c.parent_stream = s;
    c.ndevices = n;
    pthread_t t;
    TD_CHECK_EQ(pthread_create(&t, NULL, own_child_main, &c), 0);
    TD_CHECK_EQ(pthread_join(t, NULL), 0);
    TD_CHECK_MSG(c.status == TD_OK, "child: %s", c.error);
    TD_CHECK(c.started_on_default);
    TD_CHECK_EQ(c.started_device, 0);
    TD_CHECK(td_stream_equal(current_stream(dev(0)), s));
    TD_CHECK_EQ(td_device_current(type), n >= 2 ? 1 : 0);
    /* The child's stream went away with the child. */
    TD_CHECK_EQ(live_streams(), 1);
    TD_CHECK_OK(td_stream_set_current(default_stream(dev(0))));
    TD_CHECK_OK(td_device_set(dev(0)));
    td_stream_release(s);
    dev_teardown();
}

static void *outlive_child_main(void *arg)
{
    td_status *status = arg;
    td_stream *s = NULL;
    *status = td_stream_create(dev(0), 0, &s);
    if (*status != TD_OK)
        return NULL;
    *status = td_stream_set_current(s);
    td_stream_release(s);
    if (*status == TD_OK)
        *status = td_stream_sleep(NULL, FIFTY_MIL_CYCLES / 10);
    return NULL; /* exits with the stream current and its work possibly still queued */
}

/* A stream made current outlives its creator's reference; the thread's reference goes at its
 * exit, and a stream guard's references at its exit. */
TD_TEST(test_current_stream_outlives_creator, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_stream *s = new_stream(dev(0), 0);
    uint64_t id = td_stream_id(s);
    TD_CHECK_OK(td_stream_set_current(s));
    td_stream_release(s); /* the creator's reference */
    TD_CHECK_EQ(live_streams(), 1);
    td_stream *cur = current_stream(dev(0));
    TD_CHECK_EQ(td_stream_id(cur), id);
    TD_CHECK_OK(td_stream_sleep(NULL, FIFTY_MIL_CYCLES));
    TD_CHECK(!td_stream_query(cur));
    TD_CHECK(td_stream_query(default_stream(dev(0)))); /* the work went to s, not the default stream */
    TD_CHECK_OK(td_stream_synchronize(NULL));
    TD_CHECK(td_stream_query(cur));
    /* Setting it current again keeps one reference, not two. */
    TD_CHECK_OK(td_stream_set_current(cur));
    TD_CHECK_OK(td_stream_set_current(default_stream(dev(0))));
    TD_CHECK_EQ(live_streams(), 0);

    /* In a thread: released when the thread exits. */
    td_status child_status = TD_ERR_INTERNAL;
    pthread_t t;
    TD_CHECK_EQ(pthread_create(&t, NULL, outlive_child_main, &child_status), 0);
    TD_CHECK_EQ(pthread_join(t, NULL), 0);
    TD_CHECK_OK(child_status);
    TD_CHECK_EQ(live_streams(), 0);

    /* Through a stream guard: the guard's current-stream reference goes at its exit. */
    s = new_stream(dev(0), 0);
    td_stream_guard g;
    TD_CHECK_OK(td_stream_guard_enter(&g, s));
    td_stream_release(s);
    TD_CHECK_EQ(live_streams(), 1);
    TD_CHECK_OK(td_stream_sleep(NULL, 1000));
    TD_CHECK_OK(td_stream_synchronize(NULL));
    td_stream_guard_exit(&g);
    TD_CHECK_EQ(live_streams(), 0);
    dev_teardown();
}

/* The leak check itself: shutdown refuses while anything is live, names it, and tears nothing
 * down; the runtime starts again after a shutdown. */
TD_TEST(test_device_shutdown_leak_check, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_stream *s = new_stream(dev(0), 0);
    TD_CHECK_ERR(td_device_shutdown(), TD_ERR_INVALID, "still live: 1 streams, 0 events");
    TD_CHECK_OK(td_stream_sleep(s, 1000)); /* still usable */
    TD_CHECK_OK(td_stream_synchronize(s));
    td_event *e = new_event(TD_EVENT_DEFAULT);
    TD_CHECK_OK(td_event_record(e, s));
    td_stream_release(s);
    TD_CHECK_ERR(td_device_shutdown(), TD_ERR_INVALID, "0 streams, 1 events");
    TD_CHECK_OK(td_event_synchronize(e));
    td_event_release(e);
    /* A current stream of the calling thread is its own reference: shutdown drops it. */
    s = new_stream(dev(0), 0);
    TD_CHECK_OK(td_stream_set_current(s));
    td_stream_release(s);
    TD_CHECK_OK(td_device_shutdown());
    td_device_live live;
    td_device_live_get(&live);
    TD_CHECK_EQ(live.streams, 0);
    TD_CHECK_EQ(live.threads, 0);
    TD_CHECK(td_stream_equal(current_stream(dev(0)), default_stream(dev(0))));
    /* And again after the restart. */
    s = new_stream(dev(0), 0);
    TD_CHECK_OK(td_stream_sleep(s, 1000));
    TD_CHECK_OK(td_stream_synchronize(s));
    td_stream_release(s);
    dev_teardown();
}

TD_TEST_MAIN()
