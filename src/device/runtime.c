/* The device runtime's front end: device values and parsing, the per-thread current device and
 * current streams, device and stream guards, and the stream and event handles over whichever
 * implementation (sim.c, cuda.c) a device's type names.
 *
 * Every call resolves its device here once (index -1 is the thread's current device; cpu and bad
 * ordinals fail with PyTorch's messages) and then calls the implementation with the index. The
 * thread's current streams are references held in thread-local slots, released when the thread
 * exits, so a stream made current outlives its creator's reference as in PyTorch. Default streams
 * are static objects that are never freed. No lock of this file is held while an implementation
 * waits. */
#include "device/device_impl.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"

/* ---- device values ------------------------------------------------------------------------- */

/* ---- fork safety --------------------------------------------------------------------------- *
 * A forked child has none of its parent's device threads (sim's stream threads, the CUDA driver's)
 * and a CUDA driver that cannot be used again. When an implementation initializes (cuda: cuInit
 * succeeded; sim: its first stream thread started) it says so here, and a pthread_atfork child
 * handler marks each initialized type poisoned in the child. From then on device_check fails with
 * PyTorch's message, and device_impl_of hands out a poisoned table whose every function fails the
 * same way and whose destroy and free functions do nothing (the parent's objects are not the
 * child's to tear down, and waiting on the parent's threads would hang), so no entry point of that
 * type crashes or hangs. A type that was not initialized before fork is not poisoned (the child
 * may start it itself), and td_device_shutdown lets sim go back to uninitialized once its threads
 * are joined. */

#define TYPE_SLOTS 3 /* indexed by td_device_type */

static atomic_bool type_initialized[TYPE_SLOTS];
static atomic_bool type_poisoned[TYPE_SLOTS];
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void device_child_after_fork(void)
{
    for (int t = 0; t < TYPE_SLOTS; t++)
        if (atomic_load(&type_initialized[t]))
            atomic_store(&type_poisoned[t], true);
}

static void device_atfork_register(void) { (void)pthread_atfork(NULL, NULL, device_child_after_fork); }

void device_mark_initialized(td_device_type type, bool initialized)
{
    if ((unsigned)type >= TYPE_SLOTS)
        return;
    pthread_once(&atfork_once, device_atfork_register);
    atomic_store(&type_initialized[type], initialized);
}

bool device_poisoned(td_device_type type)
{
    return (unsigned)type < TYPE_SLOTS && atomic_load_explicit(&type_poisoned[type], memory_order_relaxed);
}

td_status device_fork_error(td_device_type type)
{
    /* PyTorch's words (torch/cuda/__init__.py, _lazy_init); sim says "sim" where CUDA says CUDA. */
    const char *name = type == TD_DEVICE_CUDA ? "CUDA" : td_device_type_name(type);
    char msg[192];
    snprintf(msg, sizeof msg,
             "Cannot re-initialize %s in forked subprocess. To use %s with multiprocessing, you must use the "
             "'spawn' start method",
             name, name);
    return error_set_typed(TD_ERR_UNSUPPORTED, "RuntimeError", msg);
}

/* The poisoned tables: every function of the interface, failing with the fork message. */
#define POISONED_IMPL(tag, TYPE, real)                                                                         \
    static td_status tag##_fail(void) { return device_fork_error(TYPE); }                                      \
    static int tag##_count(void) { return (real).count(); }                                                    \
    static td_status tag##_properties(int d, td_device_properties *o) { (void)d; (void)o; return tag##_fail(); } \
    static td_status tag##_mem_get_info(int d, size_t *f, size_t *t)                                          \
    {                                                                                                          \
        (void)d; (void)f; (void)t;                                                                             \
        return tag##_fail();                                                                                   \
    }                                                                                                          \
    static td_status tag##_device_synchronize(int d) { (void)d; return tag##_fail(); }                         \
    static void tag##_shutdown(void) {}                                                                        \
    static td_status tag##_device_malloc(int d, size_t n, void **o) { (void)d; (void)n; *o = NULL; return tag##_fail(); } \
    static void tag##_device_free(int d, void *p) { (void)d; (void)p; }                                        \
    static td_status tag##_host_malloc(size_t n, void **o) { (void)n; *o = NULL; return tag##_fail(); }        \
    static void tag##_host_free(void *p) { (void)p; }                                                          \
    static td_status tag##_stream_create(int d, int pr, void **o) { (void)d; (void)pr; *o = NULL; return tag##_fail(); } \
    static void tag##_stream_destroy(int d, void *s) { (void)d; (void)s; }                                     \
    static td_status tag##_stream_priority_range(int d, int *l, int *g) { (void)d; (void)l; (void)g; return tag##_fail(); } \
    static int tag##_stream_query(int d, void *s) { (void)d; (void)s; return tag##_fail(); }                   \
    static td_status tag##_stream_synchronize(int d, void *s) { (void)d; (void)s; return tag##_fail(); }       \
    static td_status tag##_stream_wait_event(int d, void *s, void *e) { (void)d; (void)s; (void)e; return tag##_fail(); } \
    static td_status tag##_event_create(int d, unsigned f, void **o) { (void)d; (void)f; *o = NULL; return tag##_fail(); } \
    static void tag##_event_destroy(int d, void *e) { (void)d; (void)e; }                                      \
    static td_status tag##_event_record(int d, void *e, void *s) { (void)d; (void)e; (void)s; return tag##_fail(); } \
    static int tag##_event_query(int d, void *e) { (void)d; (void)e; return tag##_fail(); }                    \
    static td_status tag##_event_synchronize(int d, void *e) { (void)d; (void)e; return tag##_fail(); }        \
    static td_status tag##_event_elapsed_ms(int d, void *a, void *b, float *m)                                \
    {                                                                                                          \
        (void)d; (void)a; (void)b; (void)m;                                                                    \
        return tag##_fail();                                                                                   \
    }                                                                                                          \
    static td_status tag##_event_ipc_handle(int d, void *e, td_event_ipc_handle *o)                           \
    {                                                                                                          \
        (void)d; (void)e; (void)o;                                                                             \
        return tag##_fail();                                                                                   \
    }                                                                                                          \
    static td_status tag##_event_open_ipc(int d, const td_event_ipc_handle *h, void **o)                      \
    {                                                                                                          \
        (void)d; (void)h; *o = NULL;                                                                           \
        return tag##_fail();                                                                                   \
    }                                                                                                          \
    static td_status tag##_mem_ipc_handle(int d, void *b, device_mem_ipc_handle *o)                         \
    {                                                                                                          \
        (void)d; (void)b; (void)o;                                                                             \
        return tag##_fail();                                                                                   \
    }                                                                                                          \
    static td_status tag##_mem_open_ipc(int d, const device_mem_ipc_handle *h, size_t n, void **o)            \
    {                                                                                                          \
        (void)d; (void)h; (void)n; *o = NULL;                                                                  \
        return tag##_fail();                                                                                   \
    }                                                                                                          \
    static void tag##_mem_close_ipc(int d, void *b, size_t n) { (void)d; (void)b; (void)n; }                   \
    static td_status tag##_memcpy_async(int d, void *dst, const void *src, size_t n, device_copy_kind k, void *s) \
    {                                                                                                          \
        (void)d; (void)dst; (void)src; (void)n; (void)k; (void)s;                                              \
        return tag##_fail();                                                                                   \
    }                                                                                                          \
    static td_status tag##_memcpy_peer_async(int dd, void *dst, int sd, const void *src, size_t n, void *s)    \
    {                                                                                                          \
        (void)dd; (void)dst; (void)sd; (void)src; (void)n; (void)s;                                            \
        return tag##_fail();                                                                                   \
    }                                                                                                          \
    static td_status tag##_strided_copy(int d, const device_strided *dst, const device_strided *src, size_t es, \
                                        void *s)                                                               \
    {                                                                                                          \
        (void)d; (void)dst; (void)src; (void)es; (void)s;                                                      \
        return tag##_fail();                                                                                   \
    }                                                                                                          \
    static td_status tag##_fill(int d, void *dst, size_t c, const void *v, size_t es, void *s)                 \
    {                                                                                                          \
        (void)d; (void)dst; (void)c; (void)v; (void)es; (void)s;                                               \
        return tag##_fail();                                                                                   \
    }                                                                                                          \
    static td_status tag##_add(int d, void *dst, const void *a, const void *b, size_t c, td_dtype t, void *s)  \
    {                                                                                                          \
        (void)d; (void)dst; (void)a; (void)b; (void)c; (void)t; (void)s;                                       \
        return tag##_fail();                                                                                   \
    }                                                                                                          \
    static td_status tag##_sleep(int d, int64_t c, void *s) { (void)d; (void)c; (void)s; return tag##_fail(); } \
    static td_status tag##_random(int d, void *dst, size_t c, td_dtype t, int dist, double a, double b,         \
                                  uint64_t seed, uint64_t off, void *s)                                        \
    {                                                                                                          \
        (void)d; (void)dst; (void)c; (void)t; (void)dist; (void)a; (void)b; (void)seed; (void)off; (void)s;    \
        return tag##_fail();                                                                                   \
    }                                                                                                          \
    static const device_impl tag##_impl = {                                                                    \
        .name = #tag, .type = TYPE, .count = tag##_count, .properties = tag##_properties,                      \
        .mem_get_info = tag##_mem_get_info, .device_synchronize = tag##_device_synchronize,                    \
        .shutdown = tag##_shutdown, .device_malloc = tag##_device_malloc, .device_free = tag##_device_free,    \
        .host_malloc = tag##_host_malloc, .host_free = tag##_host_free, .stream_create = tag##_stream_create,  \
        .stream_destroy = tag##_stream_destroy, .stream_priority_range = tag##_stream_priority_range,          \
        .stream_query = tag##_stream_query, .stream_synchronize = tag##_stream_synchronize,                    \
        .stream_wait_event = tag##_stream_wait_event, .event_create = tag##_event_create,                      \
        .event_destroy = tag##_event_destroy, .event_record = tag##_event_record,                              \
        .event_query = tag##_event_query, .event_synchronize = tag##_event_synchronize,                        \
        .event_elapsed_ms = tag##_event_elapsed_ms, .event_ipc_handle = tag##_event_ipc_handle,                \
        .event_open_ipc = tag##_event_open_ipc, .mem_ipc_handle = tag##_mem_ipc_handle,                        \
        .mem_open_ipc = tag##_mem_open_ipc, .mem_close_ipc = tag##_mem_close_ipc,                              \
        .memcpy_async = tag##_memcpy_async,                            \
        .memcpy_peer_async = tag##_memcpy_peer_async, .strided_copy = tag##_strided_copy, .fill = tag##_fill,  \
        .add = tag##_add, .sleep = tag##_sleep, .random = tag##_random,                                        \
    };

POISONED_IMPL(poisoned_cuda, TD_DEVICE_CUDA, device_cuda_impl)
POISONED_IMPL(poisoned_sim, TD_DEVICE_SIM, device_sim_impl)
#undef POISONED_IMPL

const device_impl *device_impl_of(td_device_type type)
{
    switch (type) {
    case TD_DEVICE_CUDA:
        return device_poisoned(type) ? &poisoned_cuda_impl : &device_cuda_impl;
    case TD_DEVICE_SIM:
        return device_poisoned(type) ? &poisoned_sim_impl : &device_sim_impl;
    default:
        return NULL;
    }
}

const char *td_device_type_name(td_device_type type)
{
    switch (type) {
    case TD_DEVICE_CPU:
        return "cpu";
    case TD_DEVICE_CUDA:
        return "cuda";
    case TD_DEVICE_SIM:
        return "sim";
    }
    return "unknown";
}

td_status td_device_parse(const char *spec, td_device *out)
{
    if (!spec || !out)
        return error_set(TD_ERR_INVALID, "td_device_parse: spec and out must not be NULL");
    static const td_device_type types[] = {TD_DEVICE_CPU, TD_DEVICE_CUDA, TD_DEVICE_SIM};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const char *name = td_device_type_name(types[i]);
        size_t n = strlen(name);
        if (strncmp(spec, name, n) != 0)
            continue;
        const char *rest = spec + n;
        td_device d = {types[i], -1};
        if (*rest == '\0') {
            *out = d;
            return TD_OK;
        }
        if (*rest != ':' || rest[1] < '0' || rest[1] > '9')
            break;
        char *end = NULL;
        long idx = strtol(rest + 1, &end, 10);
        if (*end != '\0' || idx > 1 << 20 || (types[i] == TD_DEVICE_CPU && idx != 0))
            break;
        d.index = (int)idx;
        *out = d;
        return TD_OK;
    }
    return error_fmt(TD_ERR_INVALID,
                     "Expected one of cpu, cuda, sim device type at start of device string: %s", spec);
}

char *td_device_str(td_device device, char *buf, size_t len)
{
    if (!buf || len == 0)
        return buf;
    if (device.index < 0)
        snprintf(buf, len, "%s", td_device_type_name(device.type));
    else
        snprintf(buf, len, "%s:%d", td_device_type_name(device.type), device.index);
    return buf;
}

bool td_device_equal(td_device a, td_device b) { return a.type == b.type && a.index == b.index; }

uint64_t td_device_hash(td_device device)
{
    uint64_t h = ((uint64_t)(unsigned)device.type << 32) ^ (uint64_t)(uint32_t)device.index;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

int td_device_count(td_device_type type)
{
    if (type == TD_DEVICE_CPU)
        return 1;
    const device_impl *impl = device_impl_of(type);
    return impl ? impl->count() : 0;
}

td_device_type td_device_default_type(void)
{
    const char *env = env_get_str("TDIST_DEVICE", NULL);
    if (env && strcmp(env, "cuda") == 0)
        return TD_DEVICE_CUDA;
    if (env && strcmp(env, "sim") == 0)
        return TD_DEVICE_SIM;
    return td_device_count(TD_DEVICE_CUDA) > 0 ? TD_DEVICE_CUDA : TD_DEVICE_SIM;
}

/* ---- per-thread state ---------------------------------------------------------------------- */

typedef struct thread_state {
    int current[TYPE_SLOTS];
    td_stream *streams[TYPE_SLOTS][DEVICE_MAX_DEVICES]; /* references; NULL: the default stream */
    bool registered;
} thread_state;

static _Thread_local thread_state tls;
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

static void tls_release(void *arg)
{
    thread_state *st = arg;
    for (int t = 0; t < TYPE_SLOTS; t++) {
        for (int i = 0; i < DEVICE_MAX_DEVICES; i++) {
            td_stream *s = st->streams[t][i];
            st->streams[t][i] = NULL;
            if (s)
                td_stream_release(s);
        }
    }
}

static void tls_key_create(void) { (void)pthread_key_create(&tls_key, tls_release); }

static thread_state *state(void)
{
    if (!tls.registered) {
        pthread_once(&tls_once, tls_key_create);
        tls.registered = true;
        (void)pthread_setspecific(tls_key, &tls);
    }
    return &tls;
}

static bool valid_type(td_device_type type) { return type == TD_DEVICE_CUDA || type == TD_DEVICE_SIM; }

int td_device_current(td_device_type type)
{
    return valid_type(type) ? state()->current[type] : -1;
}

/* ---- resolving devices --------------------------------------------------------------------- */

/* PyTorch's ValueError for a cpu device where an accelerator is needed, naming the accelerator
 * type this process runs on. */
static td_status not_accelerator(td_device device)
{
    char dev[32], msg[96];
    snprintf(msg, sizeof msg, "Expected a %s device, but got: %s", td_device_type_name(td_device_default_type()),
             td_device_str(device, dev, sizeof dev));
    return error_set_typed(TD_ERR_INVALID, "ValueError", msg);
}

td_status device_check(td_device device, const device_impl **impl_out, int *index_out)
{
    if (!valid_type(device.type)) {
        if (device.type == TD_DEVICE_CPU)
            return not_accelerator(device);
        return error_fmt(TD_ERR_INVALID, "Expected a cuda or sim device, but got device type %d", (int)device.type);
    }
    if (device.index < -1)
        return error_fmt(TD_ERR_INVALID, "Expected non-negative device index, but got %d", device.index);
    if (device_poisoned(device.type))
        return device_fork_error(device.type);
    int index = device.index < 0 ? state()->current[device.type] : device.index;
    const device_impl *impl = device_impl_of(device.type);
    int count = impl->count();
    if (index >= count || index >= DEVICE_MAX_DEVICES)
        return error_fmt(TD_ERR_INVALID, "Invalid device ordinal %d: there %s %d %s device%s", index,
                         count == 1 ? "is" : "are", count, impl->name, count == 1 ? "" : "s");
    if (impl_out)
        *impl_out = impl;
    if (index_out)
        *index_out = index;
    return TD_OK;
}

td_status td_device_resolve(td_device device, td_device *out)
{
    int index = 0;
    td_status st = device_check(device, NULL, &index);
    if (st != TD_OK)
        return st;
    out->type = device.type;
    out->index = index;
    return TD_OK;
}

td_status td_device_set(td_device device)
{
    td_device d;
    td_status st = td_device_resolve(device, &d);
    if (st != TD_OK)
        return st;
    state()->current[d.type] = d.index;
    return TD_OK;
}

td_status td_device_guard_enter(td_device_guard *guard, td_device device)
{
    guard->type = device.type;
    guard->prev_index = -1;
    if (device.index < 0 || device.type == TD_DEVICE_CPU)
        return TD_OK;
    td_device d;
    td_status st = td_device_resolve(device, &d);
    if (st != TD_OK)
        return st;
    guard->prev_index = state()->current[d.type];
    state()->current[d.type] = d.index;
    return TD_OK;
}

void td_device_guard_exit(td_device_guard *guard)
{
    if (guard->prev_index >= 0 && valid_type(guard->type))
        state()->current[guard->type] = guard->prev_index;
    guard->prev_index = -1;
}

td_status td_device_synchronize(td_device device)
{
    const device_impl *impl;
    int index;
    td_status st = device_check(device, &impl, &index);
    return st != TD_OK ? st : impl->device_synchronize(index);
}

td_status td_device_get_properties(td_device device, td_device_properties *out)
{
    const device_impl *impl;
    int index;
    td_status st = device_check(device, &impl, &index);
    if (st != TD_OK)
        return st;
    memset(out, 0, sizeof *out);
    return impl->properties(index, out);
}

td_status td_device_mem_get_info(td_device device, size_t *free_bytes, size_t *total_bytes)
{
    const device_impl *impl;
    int index;
    td_status st = device_check(device, &impl, &index);
    return st != TD_OK ? st : impl->mem_get_info(index, free_bytes, total_bytes);
}

/* ---- live objects -------------------------------------------------------------------------- */

static atomic_long live_streams;
static atomic_long live_events;

void device_count_stream(int delta) { atomic_fetch_add(&live_streams, delta); }
void device_count_event(int delta) { atomic_fetch_add(&live_events, delta); }

/* ---- streams ------------------------------------------------------------------------------- */

static td_stream default_streams[TYPE_SLOTS][DEVICE_MAX_DEVICES];
static pthread_once_t defaults_once = PTHREAD_ONCE_INIT;
static atomic_uint_fast64_t next_stream_id = 1;

static void defaults_init(void)
{
    for (int t = 0; t < TYPE_SLOTS; t++) {
        for (int i = 0; i < DEVICE_MAX_DEVICES; i++) {
            td_stream *s = &default_streams[t][i];
            ref_init(&s->refcount);
            s->device.type = (td_device_type)t;
            s->device.index = i;
            s->is_default = true;
        }
    }
}

static td_stream *default_stream_of(td_device resolved)
{
    pthread_once(&defaults_once, defaults_init);
    return &default_streams[resolved.type][resolved.index];
}

td_stream *device_current_stream(td_device resolved)
{
    td_stream *s = state()->streams[resolved.type][resolved.index];
    return s ? s : default_stream_of(resolved);
}

static td_status new_stream(td_device d, void *native, int priority, bool external, uint64_t id, td_stream **out)
{
    td_stream *s = TD_NEW(td_stream);
    ref_init(&s->refcount);
    s->device = d;
    s->native = native;
    s->priority = priority;
    s->external = external;
    s->id = id;
    device_count_stream(1);
    *out = s;
    return TD_OK;
}

td_status td_stream_create(td_device device, int priority, td_stream **out)
{
    const device_impl *impl;
    td_device d;
    td_status st = device_check(device, &impl, &d.index);
    if (st != TD_OK)
        return st;
    d.type = device.type;
    int least = 0, greatest = 0;
    st = impl->stream_priority_range(d.index, &least, &greatest);
    if (st != TD_OK)
        return st;
    if (priority > least || priority < greatest)
        return error_fmt(TD_ERR_INVALID, "Stream priority %d is outside the device's range [%d, %d]", priority,
                         greatest, least);
    void *native = NULL;
    st = impl->stream_create(d.index, priority, &native);
    if (st != TD_OK)
        return st;
    return new_stream(d, native, priority, false, atomic_fetch_add(&next_stream_id, 1), out);
}

td_status td_stream_from_external(void *native, td_device device, td_stream **out)
{
    if (!native)
        return error_set(TD_ERR_INVALID, "td_stream_from_external: the external stream must not be NULL");
    td_device d;
    td_status st = td_device_resolve(device, &d);
    if (st != TD_OK)
        return st;
    /* As PyTorch's external streams: the id is the native handle, so two wrappers of one handle
     * are equal. Created streams count up from 1 and never reach the top bit. */
    return new_stream(d, native, 0, true, (uint64_t)(uintptr_t)native | (1ULL << 63), out);
}

td_stream *td_stream_retain(td_stream *s)
{
    if (s && !s->is_default)
        ref_inc(&s->refcount);
    return s;
}

void td_stream_release(td_stream *s)
{
    if (!s || s->is_default || !ref_dec(&s->refcount))
        return;
    if (!s->external) {
        const device_impl *impl = device_impl_of(s->device.type);
        impl->stream_destroy(s->device.index, s->native);
    }
    device_count_stream(-1);
    free(s);
}

td_status td_stream_default(td_device device, td_stream **out)
{
    td_device d;
    td_status st = td_device_resolve(device, &d);
    if (st != TD_OK)
        return st;
    *out = default_stream_of(d);
    return TD_OK;
}

td_status td_stream_current(td_device device, td_stream **out)
{
    td_device d;
    td_status st = td_device_resolve(device, &d);
    if (st != TD_OK)
        return st;
    *out = device_current_stream(d);
    return TD_OK;
}

static void set_current_stream(td_stream *s)
{
    thread_state *ts = state();
    td_stream **slot = &ts->streams[s->device.type][s->device.index];
    td_stream *old = *slot;
    *slot = s->is_default ? NULL : td_stream_retain(s);
    if (old)
        td_stream_release(old);
}

td_status td_stream_set_current(td_stream *s)
{
    if (!s)
        return error_set(TD_ERR_INVALID, "td_stream_set_current: the stream must not be NULL");
    set_current_stream(s);
    return TD_OK;
}

td_device td_stream_device(const td_stream *s) { return s->device; }
int td_stream_priority(const td_stream *s) { return s->priority; }
void *td_stream_native(const td_stream *s) { return s->native; }
uint64_t td_stream_id(const td_stream *s) { return s->id; }

bool td_stream_equal(const td_stream *a, const td_stream *b)
{
    return a && b && td_device_equal(a->device, b->device) && a->id == b->id;
}

uint64_t td_stream_hash(const td_stream *s)
{
    uint64_t h = td_device_hash(s->device) ^ (s->id * 0x9e3779b97f4a7c15ULL);
    return h ^ (h >> 29);
}

td_status td_stream_priority_range(td_device device, int *least, int *greatest)
{
    const device_impl *impl;
    int index;
    td_status st = device_check(device, &impl, &index);
    return st != TD_OK ? st : impl->stream_priority_range(index, least, greatest);
}

/* The stream a NULL argument means: the current stream of the current device of the default
 * accelerator type. */
static td_status stream_or_current(td_stream *s, td_stream **out)
{
    if (s) {
        *out = s;
        return TD_OK;
    }
    td_device d = {td_device_default_type(), -1};
    return td_stream_current(d, out);
}

bool td_stream_query(td_stream *s)
{
    if (stream_or_current(s, &s) != TD_OK)
        return false;
    return device_impl_of(s->device.type)->stream_query(s->device.index, s->native) == 1;
}

td_status td_stream_synchronize(td_stream *s)
{
    td_status st = stream_or_current(s, &s);
    return st != TD_OK ? st : device_impl_of(s->device.type)->stream_synchronize(s->device.index, s->native);
}

td_status td_stream_sleep(td_stream *s, int64_t cycles)
{
    td_status st = stream_or_current(s, &s);
    if (st != TD_OK)
        return st;
    if (cycles < 0)
        return error_fmt(TD_ERR_INVALID, "td_stream_sleep: cycles must not be negative, got %" PRId64, cycles);
    return device_impl_of(s->device.type)->sleep(s->device.index, cycles, s->native);
}

td_status td_stream_guard_enter(td_stream_guard *guard, td_stream *s)
{
    memset(guard, 0, sizeof *guard);
    if (!s)
        return error_set(TD_ERR_INVALID, "td_stream_guard_enter: the stream must not be NULL");
    thread_state *ts = state();
    td_device prev = {s->device.type, ts->current[s->device.type]};
    guard->prev_device = prev;
    guard->prev_stream_on_prev_device = td_stream_retain(device_current_stream(prev));
    guard->prev_stream_on_device = td_stream_retain(device_current_stream(s->device));
    ts->current[s->device.type] = s->device.index;
    set_current_stream(s);
    return TD_OK;
}

void td_stream_guard_exit(td_stream_guard *guard)
{
    if (!guard->prev_stream_on_device)
        return;
    set_current_stream(guard->prev_stream_on_device);
    set_current_stream(guard->prev_stream_on_prev_device);
    state()->current[guard->prev_device.type] = guard->prev_device.index;
    td_stream_release(guard->prev_stream_on_device);
    td_stream_release(guard->prev_stream_on_prev_device);
    memset(guard, 0, sizeof *guard);
}

/* ---- events -------------------------------------------------------------------------------- */

td_status td_event_create(unsigned flags, td_event **out)
{
    if (flags & ~(unsigned)(TD_EVENT_ENABLE_TIMING | TD_EVENT_BLOCKING | TD_EVENT_INTERPROCESS))
        return error_fmt(TD_ERR_INVALID, "td_event_create: unknown flags 0x%x", flags);
    if ((flags & TD_EVENT_INTERPROCESS) && (flags & TD_EVENT_ENABLE_TIMING))
        return error_set(TD_ERR_INVALID, "An interprocess event cannot have timing enabled");
    td_event *e = TD_NEW(td_event);
    ref_init(&e->refcount);
    e->flags = flags;
    e->device.type = TD_DEVICE_CPU;
    e->device.index = -1;
    device_count_event(1);
    *out = e;
    return TD_OK;
}

td_event *td_event_retain(td_event *e)
{
    if (e)
        ref_inc(&e->refcount);
    return e;
}

void td_event_release(td_event *e)
{
    if (!e || !ref_dec(&e->refcount))
        return;
    if (e->native)
        device_impl_of(e->device.type)->event_destroy(e->device.index, e->native);
    device_count_event(-1);
    free(e);
}

td_status td_event_record(td_event *e, td_stream *s)
{
    td_status st = stream_or_current(s, &s);
    if (st != TD_OK)
        return st;
    const device_impl *impl = device_impl_of(s->device.type);
    if (!e->native) {
        st = impl->event_create(s->device.index, e->flags, &e->native);
        if (st != TD_OK)
            return st;
        e->device = s->device;
    } else if (!td_device_equal(e->device, s->device)) {
        /* PyTorch's words (CUDAEvent::record): the two device indices. */
        return error_fmt(TD_ERR_INVALID, "Event device %d does not match recording stream's device %d.",
                         e->device.index, s->device.index);
    }
    st = impl->event_record(s->device.index, e->native, s->native);
    if (st == TD_OK)
        e->recorded = true;
    return st;
}

/* Whether the implementation must be asked about e: once recorded here, or, for an interprocess
 * event, as soon as it exists (another process may have recorded it). */
static bool event_has_state(const td_event *e)
{
    return e->native && (e->recorded || (e->flags & TD_EVENT_INTERPROCESS));
}

bool td_event_query(td_event *e)
{
    if (!event_has_state(e))
        return true;
    return device_impl_of(e->device.type)->event_query(e->device.index, e->native) == 1;
}

td_status td_event_synchronize(td_event *e)
{
    if (!event_has_state(e))
        return TD_OK;
    return device_impl_of(e->device.type)->event_synchronize(e->device.index, e->native);
}

td_status td_event_elapsed_time(td_event *start, td_event *end, float *ms)
{
    if (!start->recorded || !end->recorded)
        return error_set(TD_ERR_INVALID, "Both events must be recorded before calculating elapsed time.");
    if (!(start->flags & TD_EVENT_ENABLE_TIMING) || !(end->flags & TD_EVENT_ENABLE_TIMING))
        return error_set(TD_ERR_INVALID, "Both events must be created with argument 'enable_timing=True'.");
    if (!td_device_equal(start->device, end->device)) {
        char a[32], b[32];
        return error_fmt(TD_ERR_INVALID, "%s error: invalid resource handle (elapsed time between events on %s and %s)",
                         start->device.type == TD_DEVICE_CUDA ? "CUDA" : td_device_type_name(start->device.type),
                         td_device_str(start->device, a, sizeof a), td_device_str(end->device, b, sizeof b));
    }
    return device_impl_of(start->device.type)->event_elapsed_ms(start->device.index, start->native, end->native, ms);
}

td_device td_event_device(const td_event *e) { return e->device; }

td_status td_stream_wait_event(td_stream *s, td_event *e)
{
    td_status st = stream_or_current(s, &s);
    if (st != TD_OK)
        return st;
    if (!event_has_state(e))
        return TD_OK; /* nothing recorded: nothing to wait for */
    return device_impl_of(s->device.type)->stream_wait_event(s->device.index, s->native, e->native);
}

td_status td_stream_wait_stream(td_stream *s, td_stream *other)
{
    td_event *e = NULL;
    td_status st = td_event_create(TD_EVENT_DEFAULT, &e);
    if (st != TD_OK)
        return st;
    st = td_event_record(e, other);
    if (st == TD_OK)
        st = td_stream_wait_event(s, e);
    td_event_release(e);
    return st;
}

td_status td_event_ipc_handle_get(td_event *e, td_event_ipc_handle *out)
{
    if (!(e->flags & TD_EVENT_INTERPROCESS))
        return error_set(TD_ERR_INVALID, "The event was not created with TD_EVENT_INTERPROCESS (interprocess=True)");
    if (!e->native) {
        /* As torch's lazy events: one never recorded is created on the current device of the
         * default accelerator type when its handle is first taken (test_event_handle_exporter). */
        const device_impl *impl;
        td_device d = {td_device_default_type(), -1};
        td_status st = device_check(d, &impl, &d.index);
        if (st != TD_OK)
            return st;
        st = impl->event_create(d.index, e->flags, &e->native);
        if (st != TD_OK)
            return st;
        e->device = d;
    }
    /* The export runs on the event's own device, whatever is current (the implementation's
     * calls take the device index). */
    return device_impl_of(e->device.type)->event_ipc_handle(e->device.index, e->native, out);
}

td_status td_event_from_ipc_handle(td_device device, const td_event_ipc_handle *handle, td_event **out)
{
    const device_impl *impl;
    td_device d = device;
    td_status st = device_check(device, &impl, &d.index);
    if (st != TD_OK)
        return st;
    void *native = NULL;
    st = impl->event_open_ipc(d.index, handle, &native);
    if (st != TD_OK)
        return st;
    st = td_event_create(TD_EVENT_INTERPROCESS, out);
    if (st != TD_OK) {
        impl->event_destroy(d.index, native);
        return st;
    }
    (*out)->native = native;
    (*out)->device = d;
    (*out)->recorded = true;
    return TD_OK;
}

/* ---- lifetime ------------------------------------------------------------------------------ */

static int64_t allocated_everywhere(void)
{
    int64_t total = 0;
    static const td_device_type types[] = {TD_DEVICE_CUDA, TD_DEVICE_SIM};
    for (size_t t = 0; t < 2; t++) {
        int n = td_device_count(types[t]);
        for (int i = 0; i < n && i < DEVICE_MAX_DEVICES; i++) {
            td_device d = {types[t], i};
            int64_t v = td_memory_allocated(d);
            if (v > 0)
                total += v;
        }
    }
    return total;
}

void td_device_live_get(td_device_live *out)
{
    memset(out, 0, sizeof *out);
    out->streams = atomic_load(&live_streams);
    out->events = atomic_load(&live_events);
    out->allocated_bytes = allocated_everywhere();
    out->host_blocks = device_host_live_blocks();
    out->threads = device_sim_thread_count();
}

td_status td_device_shutdown(void)
{
    /* The calling thread's current streams are its own references: drop them first. */
    tls_release(state());
    td_device_live live;
    td_device_live_get(&live);
    if (live.streams || live.events || live.allocated_bytes || live.host_blocks)
        return error_fmt(TD_ERR_INVALID,
                         "td_device_shutdown: still live: %lld streams, %lld events, %lld bytes of device memory, "
                         "%lld pinned host blocks",
                         (long long)live.streams, (long long)live.events, (long long)live.allocated_bytes,
                         (long long)live.host_blocks);
    (void)device_allocator_release_all();
    (void)device_host_release_all();
    /* Through device_impl_of: in a forked child a poisoned type's shutdown touches nothing. */
    device_impl_of(TD_DEVICE_SIM)->shutdown();
    device_impl_of(TD_DEVICE_CUDA)->shutdown();
    for (int t = 0; t < TYPE_SLOTS; t++)
        tls.current[t] = 0;
    return TD_OK;
}
