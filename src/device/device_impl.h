/* Internal: the device layer's one interface, implemented twice (sim.c, cuda.c), and the objects
 * the front end (runtime.c), the caching allocators (allocator.c, host_alloc.c) and the tensor
 * layer share.
 *
 * An implementation knows nothing of current devices, guards, refcounts or caching: it moves bytes,
 * runs the few kernels the runtime needs and manages native streams and events of one device
 * index. Every function takes the device index it acts on; an implementation makes that device
 * its own current one internally if it must (cuda: cuCtxSetCurrent of the primary context), so the
 * front end never has to "set the device" before a call. Native streams: NULL is the device's
 * default stream. Functions return td_status and set the thread's message (error_set) on failure,
 * with the driver's text where there is one ("CUDA error: invalid resource handle").
 *
 * Thread safety: every function may be called from any thread at any time; blocking ones
 * (stream_synchronize, event_synchronize, device_synchronize) must not hold a lock shared with
 * other devices or streams while they wait. */
#ifndef TDIST_DEVICE_IMPL_H
#define TDIST_DEVICE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/device.h>

#include "base/ref.h"

#define DEVICE_MAX_DEVICES 64
#define DEVICE_MAX_KERNEL_DIMS TD_MAX_DIMS

/* A strided operand of a kernel: base is a device address of element 0 (offset applied). */
typedef struct device_strided {
    void *base;
    int ndim;
    int64_t sizes[DEVICE_MAX_KERNEL_DIMS];
    int64_t strides[DEVICE_MAX_KERNEL_DIMS]; /* elements */
} device_strided;

typedef struct device_mem_ipc_handle {
    unsigned char bytes[64];
} device_mem_ipc_handle;

typedef enum device_copy_kind {
    DEVICE_COPY_H2D = 0, /* host (pageable or pinned) to this device */
    DEVICE_COPY_D2H,
    DEVICE_COPY_D2D,     /* within this device */
} device_copy_kind;

typedef struct device_impl {
    const char *name;    /* "cuda", "sim" */
    td_device_type type;

    /* Devices. count loads the driver on first use (once, thread-safe) and returns 0 when there is
     * none; it never fails. */
    int (*count)(void);
    td_status (*properties)(int dev, td_device_properties *out);
    td_status (*mem_get_info)(int dev, size_t *free_bytes, size_t *total_bytes);
    td_status (*device_synchronize)(int dev);
    /* Drops what the implementation made for its devices (sim: default streams and their
     * threads; cuda keeps its primary contexts for the life of the process, as the CUDA runtime
     * does); called by td_device_shutdown once nothing is live. */
    void (*shutdown)(void);

    /* Raw memory, uncached: the caching allocators sit on these. device_malloc fails with
     * TD_ERR_NOMEM ("CUDA out of memory. Tried to allocate ...") when the device is full. */
    td_status (*device_malloc)(int dev, size_t nbytes, void **out);
    void (*device_free)(int dev, void *ptr);
    td_status (*host_malloc)(size_t nbytes, void **out); /* page-locked host memory */
    void (*host_free)(void *ptr);

    /* Native streams. priority: 0 default, lower is higher priority. */
    td_status (*stream_create)(int dev, int priority, void **out);
    void (*stream_destroy)(int dev, void *stream);
    td_status (*stream_priority_range)(int dev, int *least, int *greatest);
    /* 1: all work done, 0: work pending, < 0: an error (status). */
    int (*stream_query)(int dev, void *stream);
    td_status (*stream_synchronize)(int dev, void *stream);
    td_status (*stream_wait_event)(int dev, void *stream, void *event);

    /* Native events, created on dev. flags: TD_EVENT_*. */
    td_status (*event_create)(int dev, unsigned flags, void **out);
    void (*event_destroy)(int dev, void *event);
    td_status (*event_record)(int dev, void *event, void *stream);
    int (*event_query)(int dev, void *event); /* as stream_query */
    td_status (*event_synchronize)(int dev, void *event);
    td_status (*event_elapsed_ms)(int dev, void *start, void *end, float *ms);
    td_status (*event_ipc_handle)(int dev, void *event, td_event_ipc_handle *out);
    td_status (*event_open_ipc)(int dev, const td_event_ipc_handle *handle, void **out);

    /* Device memory shared between processes (spec L). mem_ipc_handle names a segment base that
     * device_malloc returned (cuda: cuIpcGetMemHandle; sim: the segment's memfd); mem_open_ipc
     * maps such a handle of another process (cuda: cuIpcOpenMemHandle_v2 with lazy peer access,
     * at most once per handle and process: callers cache it) and mem_close_ipc unmaps it. nbytes:
     * the segment's size, as the exporter's allocator knows it. */
    td_status (*mem_ipc_handle)(int dev, void *base, device_mem_ipc_handle *out);
    td_status (*mem_open_ipc)(int dev, const device_mem_ipc_handle *handle, size_t nbytes, void **base);
    void (*mem_close_ipc)(int dev, void *base, size_t nbytes);

    /* Work queued on a stream of dev (asynchronous unless said otherwise). */
    td_status (*memcpy_async)(int dev, void *dst, const void *src, size_t nbytes, device_copy_kind kind,
                              void *stream);
    /* dst on dst_dev, src on src_dev, queued on stream of src_dev. */
    td_status (*memcpy_peer_async)(int dst_dev, void *dst, int src_dev, const void *src, size_t nbytes,
                                   void *stream);
    /* Elementwise dst = src for equal sizes, elem_size 1, 2, 4, 8 or 16 bytes, both on dev. */
    td_status (*strided_copy)(int dev, const device_strided *dst, const device_strided *src, size_t elem_size,
                              void *stream);
    /* count elements of elem_size bytes each set to the pattern at value (host memory). */
    td_status (*fill)(int dev, void *dst, size_t count, const void *value, size_t elem_size, void *stream);
    /* dst[i] = a[i] + b[i] for count contiguous elements of dtype (dst may be a or b). Dtypes
     * without a kernel: TD_ERR_UNSUPPORTED. */
    td_status (*add)(int dev, void *dst, const void *a, const void *b, size_t count, td_dtype dtype, void *stream);
    /* Spins about cycles device clock cycles. */
    td_status (*sleep)(int dev, int64_t cycles, void *stream);
    /* count contiguous elements of dtype (float16, bfloat16, float32, float64; others
     * TD_ERR_UNSUPPORTED) drawn by the Philox of philox.h at (seed, offset): dist
     * PHILOX_DIST_UNIFORM gives a + (b - a) * u, PHILOX_DIST_NORMAL a + b * z. Element i depends
     * only on (seed, offset, i), so the same arguments give the same bits on one implementation. */
    td_status (*random)(int dev, void *dst, size_t count, td_dtype dtype, int dist, double a, double b, uint64_t seed,
                        uint64_t offset, void *stream);
} device_impl;

extern const device_impl device_sim_impl;
extern const device_impl device_cuda_impl;

/* The implementation of an accelerator type; NULL for cpu. */
const device_impl *device_impl_of(td_device_type type);

/* The public handles (runtime.c creates them; the allocators and the tensor layer read them). */
struct td_stream {
    td_ref refcount;     /* default streams: not counted, never freed before shutdown */
    td_device device;    /* resolved: index >= 0 */
    void *native;        /* NULL: the device's default stream */
    int priority;
    uint64_t id;         /* 0: default stream; else unique per process */
    bool is_default;
    bool external;       /* wrapped, not owned */
};

struct td_event {
    td_ref refcount;
    unsigned flags;
    td_device device;    /* index -1 until the first record */
    void *native;        /* created at the first record (or opened from an IPC handle) */
    bool recorded;
};

/* Runtime internals the other device files use. */
/* The implementation and resolved device index of a stream / an explicit device (TD_ERR_INVALID
 * with the spec's message for cpu or a bad index). */
td_status device_check(td_device device, const device_impl **impl, int *index);
/* The current stream of a resolved device (borrowed). */
td_stream *device_current_stream(td_device device);
/* rng.c: the (seed, offset) a random kernel on a resolved device runs with, taken from the
 * device's generator under its lock, which then advances the offset by PHILOX_OFFSET_PER_CALL. */
void device_rng_take(td_device resolved, uint64_t *seed, uint64_t *offset);
/* Live-object counters for td_device_live_get (atomics). */
void device_count_stream(int delta);
void device_count_event(int delta);

/* Fork safety (runtime.c): an implementation calls device_mark_initialized(type, true) once it
 * has state a forked child cannot use (cuda: cuInit succeeded; sim: a stream thread started), and
 * (type, false) when that state is gone again (sim's shutdown). In a child forked while a type was
 * initialized, device_poisoned(type) is true, device_check and every function of
 * device_impl_of(type) fail with device_fork_error ("Cannot re-initialize CUDA in forked
 * subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method"; sim says
 * "sim"), and destroy / free functions do nothing. */
void device_mark_initialized(td_device_type type, bool initialized);
bool device_poisoned(td_device_type type);
td_status device_fork_error(td_device_type type);

/* allocator.c: the per-device caching allocator (td_device_malloc and the stats). */
/* The segment (native allocation) holding ptr, an address td_device_malloc returned and not yet
 * freed: its base and size, and the device. TD_ERR_INVALID otherwise. */
td_status device_allocator_segment_of(const void *ptr, td_device *device, void **base, size_t *size);
/* Frees every cached block on every device (shutdown); returns bytes still allocated. */
int64_t device_allocator_release_all(void);
/* host_alloc.c: frees every cached pinned block (shutdown), returns the blocks still in use;
 * device_host_live_blocks: pinned blocks handed out and not yet freed. */
int64_t device_host_release_all(void);
int64_t device_host_live_blocks(void);
/* sim.c: running stream threads, for td_device_live_get. */
int64_t device_sim_thread_count(void);

#endif
