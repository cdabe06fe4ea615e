/* tdist/device.h: the multi-device runtime (torch.cuda in C).
 *
 * One interface over two device types:
 *   - TD_DEVICE_CUDA: NVIDIA GPUs through the CUDA driver, loaded at run time (libcuda.so.1). The
 *     library loads and runs on a machine without a driver or GPU: it then has zero CUDA devices.
 *   - TD_DEVICE_SIM: host-simulated devices (TDIST_SIM_DEVICES=N, default 0), whose memory is host
 *     memory under a per-device budget (TDIST_SIM_MEMORY, default 4 GiB), whose streams are FIFOs
 *     each run in order by a thread, and whose events complete when their stream reaches them. The
 *     same program runs against either type, which is how tdist tests multi-device code anywhere.
 *
 * Devices are values (type, index). Each thread has a current device per type (starting at 0) and
 * a current stream per device (starting at the device's default stream); guards set them and
 * restore what they saw on entry. Device memory comes from a caching allocator with PyTorch's
 * rules and statistics (memory_stats); pinned host memory from a caching host allocator whose
 * blocks are reused only after the copies that used them are done.
 *
 * Handles: td_stream and td_event are refcounted (retain / release); functions that return one
 * through an out-parameter give a new reference; arguments are borrowed. A NULL td_stream argument
 * means the current stream of the current device. Blocking waits (synchronize) never hold a
 * library lock, so threads waiting on different devices overlap.
 *
 * Errors carry PyTorch's messages ("Expected a cuda device, but got: cpu",
 * "Both events must be recorded before calculating elapsed time.").
 * Device tensors and the comm primitives over them (broadcast, scatter, gather, reduce_add) are at
 * the end of this header; see docs/devices.md.
 */
#ifndef TDIST_DEVICE_H
#define TDIST_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/status.h>
#include <tdist/tensor.h>
#include <tdist/value.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- devices ------------------------------------------------------------------------------ */
/* td_device and td_device_type are declared in tdist/tensor.h (storages carry them). */

/* "cpu", "cuda", "sim". */
TD_API const char *td_device_type_name(td_device_type type);
/* Parses "cpu", "cuda", "cuda:1", "sim", "sim:0"; no index gives index -1 (the current device).
 * TD_ERR_INVALID for anything else. */
TD_API td_status td_device_parse(const char *spec, td_device *out);
/* "cuda:1", "sim:0", "cpu", "cuda" (index -1) into buf; returns buf. */
TD_API char *td_device_str(td_device device, char *buf, size_t len);
TD_API bool td_device_equal(td_device a, td_device b);
TD_API uint64_t td_device_hash(td_device device);

/* The number of devices of a type: 0 when there are none (for cuda: no driver, no GPU). CPU: 1. */
TD_API int td_device_count(td_device_type type);
/* The accelerator type tests and examples run on: TDIST_DEVICE=cuda|sim when set, else cuda when a
 * CUDA device exists, else sim. */
TD_API td_device_type td_device_default_type(void);

/* Resolves a device argument: index -1 becomes the thread's current device of that type. Checks
 * that the device is an accelerator (cpu: "Expected a cuda device, but got: cpu") and that the
 * index exists ("Invalid device ordinal 9: there are 2 cuda devices"). */
TD_API td_status td_device_resolve(td_device device, td_device *out);

/* The calling thread's current device index of a type (0 until set). */
TD_API int td_device_current(td_device_type type);
TD_API td_status td_device_set(td_device device);

/* with torch.cuda.device(i): enter saves the current device of device.type and sets device; exit
 * restores the one saved at entry, whatever was set inside. Guards nest LIFO. An index of -1
 * (or a cpu device) makes a guard that does nothing. */
typedef struct td_device_guard {
    td_device_type type;
    int prev_index; /* -1: the guard did nothing */
} td_device_guard;
TD_API td_status td_device_guard_enter(td_device_guard *guard, td_device device);
TD_API void td_device_guard_exit(td_device_guard *guard);

/* Waits for all work queued on the device (only that device). */
TD_API td_status td_device_synchronize(td_device device);

typedef struct td_device_properties {
    char name[256];
    size_t total_memory;
    int major, minor;          /* compute capability; sim: 0.0 */
    int multi_processor_count;
    int clock_rate_khz;        /* what td_stream_sleep's cycles are counted in */
} td_device_properties;
TD_API td_status td_device_get_properties(td_device device, td_device_properties *out);
/* (free, total) bytes of device memory as the driver sees them (cudaMemGetInfo). */
TD_API td_status td_device_mem_get_info(td_device device, size_t *free_bytes, size_t *total_bytes);

/* ---- streams ------------------------------------------------------------------------------ */

typedef struct td_stream td_stream;
typedef struct td_event td_event;

/* A new stream on device (index -1: current) with a priority in the range td_stream_priority_range
 * gives (0 is the default, lower numbers are higher priority). */
TD_API td_status td_stream_create(td_device device, int priority, td_stream **out);
/* Wraps a stream created by foreign code (a CUstream / cudaStream_t) without owning it: releasing
 * the wrapper never destroys it. index -1: the current device. */
TD_API td_status td_stream_from_external(void *native, td_device device, td_stream **out);
TD_API td_stream *td_stream_retain(td_stream *s);
TD_API void td_stream_release(td_stream *s);
/* The device's default stream (borrowed: it lives as long as the runtime). */
TD_API td_status td_stream_default(td_device device, td_stream **out);
/* The calling thread's current stream on device (borrowed: valid while it stays current or is
 * otherwise referenced). */
TD_API td_status td_stream_current(td_device device, td_stream **out);
/* Makes s the calling thread's current stream on s's device (does not change the current device). */
TD_API td_status td_stream_set_current(td_stream *s);

TD_API td_device td_stream_device(const td_stream *s);
TD_API int td_stream_priority(const td_stream *s);
/* The native handle (CUstream; NULL for a CUDA default stream, as cuda_stream == 0). */
TD_API void *td_stream_native(const td_stream *s);
/* A stream id unique within its device; equal streams have equal ids (default stream: 0). */
TD_API uint64_t td_stream_id(const td_stream *s);
/* Same device and same stream: two default streams of different devices are not equal. */
TD_API bool td_stream_equal(const td_stream *a, const td_stream *b);
TD_API uint64_t td_stream_hash(const td_stream *s);
/* (least, greatest) priority of the device type, as cudaDeviceGetStreamPriorityRange: (0, -1) or
 * lower greatest values; sim: (0, -1). */
TD_API td_status td_stream_priority_range(td_device device, int *least, int *greatest);

/* True when every queued work item is done. query and synchronize work from any current device. */
TD_API bool td_stream_query(td_stream *s);
TD_API td_status td_stream_synchronize(td_stream *s);
/* Later work on s waits for the event's recorded work / for everything queued on other so far. */
TD_API td_status td_stream_wait_event(td_stream *s, td_event *e);
TD_API td_status td_stream_wait_stream(td_stream *s, td_stream *other);
/* Queues a spin of about `cycles` device clock cycles on s (NULL: current stream) and returns at
 * once (torch.cuda._sleep); sim devices count cycles at clock_rate_khz. */
TD_API td_status td_stream_sleep(td_stream *s, int64_t cycles);

/* with torch.cuda.stream(s): enter saves the current device, the current stream of that device and
 * the current stream of s's device, then makes s's device current and s its current stream; exit
 * restores all three. */
typedef struct td_stream_guard {
    td_device prev_device;
    td_stream *prev_stream_on_prev_device; /* references held by the guard */
    td_stream *prev_stream_on_device;
} td_stream_guard;
TD_API td_status td_stream_guard_enter(td_stream_guard *guard, td_stream *s);
TD_API void td_stream_guard_exit(td_stream_guard *guard);

/* ---- events ------------------------------------------------------------------------------- */

enum {
    TD_EVENT_DEFAULT = 0,
    TD_EVENT_ENABLE_TIMING = 1, /* elapsed_time works (otherwise timing is disabled, as torch) */
    TD_EVENT_BLOCKING = 2,      /* synchronize sleeps rather than spins */
    TD_EVENT_INTERPROCESS = 4,  /* can be shared with another process (implies no timing) */
};

/* An event with TD_EVENT_* flags. It has no device until its first record, which creates it on the
 * recording stream's device. */
TD_API td_status td_event_create(unsigned flags, td_event **out);
TD_API td_event *td_event_retain(td_event *e);
TD_API void td_event_release(td_event *e);
/* Records the work queued so far on s (NULL: the current stream of the current device). Recording
 * on another device than the event's fails: "Event device X does not match recording stream's
 * device Y." */
TD_API td_status td_event_record(td_event *e, td_stream *s);
/* True when never recorded or when the recorded work is done. */
TD_API bool td_event_query(td_event *e);
TD_API td_status td_event_synchronize(td_event *e);
/* Milliseconds from start to end: both recorded, timing enabled, same device. */
TD_API td_status td_event_elapsed_time(td_event *start, td_event *end, float *ms);
/* The event's device; index -1 before the first record. */
TD_API td_device td_event_device(const td_event *e);

/* Events shared between processes: the handle is plain bytes to send as the program likes; the
 * event must have TD_EVENT_INTERPROCESS. One never recorded is created on the current device of
 * the default type when its handle is first taken (as torch's lazy events). An interprocess event's
 * state is shared: query, synchronize and stream waits see the latest record made in any process
 * that holds it (the exporter sees an importer's record). The exporter must hold the event while
 * others open its handle. sim: the handle names a shared page of the exporting process (any
 * process of the same user can open it, this one included); cuda: cuIpcGetEventHandle's bytes. */
typedef struct td_event_ipc_handle {
    unsigned char bytes[80];
} td_event_ipc_handle;
TD_API td_status td_event_ipc_handle_get(td_event *e, td_event_ipc_handle *out);
TD_API td_status td_event_from_ipc_handle(td_device device, const td_event_ipc_handle *handle, td_event **out);

/* ---- device memory: the caching allocator ------------------------------------------------- *
 * PyTorch's native caching allocator: requests round up to 512 bytes; requests up to 1 MiB come
 * from 2 MiB segments of the small pool, larger ones from the large pool (20 MiB segments below
 * 10 MiB, else rounded to 2 MiB); blocks split and merge; a freed block returns to its stream's
 * pool and is reused by that stream at once, by others only after the streams it was recorded on
 * (td_device_record_stream) have finished the work queued at free time. Zero bytes give NULL and
 * touch no statistic. */

/* stream: where the memory will be used (NULL: the current stream of device). */
TD_API td_status td_device_malloc(td_device device, size_t nbytes, td_stream *stream, void **out);
/* Returns a block to the cache; NULL is a no-op. */
TD_API void td_device_free(void *ptr);
/* ptr's block is in use on s too: it is not reused before s's work queued until its free is done. */
TD_API td_status td_device_record_stream(void *ptr, td_stream *s);
/* Releases every cached block that no live allocation uses, on every device (torch.cuda.empty_cache). */
TD_API td_status td_device_empty_cache(void);

typedef enum td_memory_stat_family {
    TD_STAT_ALLOCATION = 0,
    TD_STAT_SEGMENT,
    TD_STAT_ACTIVE,
    TD_STAT_INACTIVE_SPLIT,
    TD_STAT_ALLOCATED_BYTES,
    TD_STAT_RESERVED_BYTES,
    TD_STAT_ACTIVE_BYTES,
    TD_STAT_INACTIVE_SPLIT_BYTES,
    TD_STAT_REQUESTED_BYTES,
    TD_STAT_FAMILY_COUNT
} td_memory_stat_family;
typedef enum td_memory_pool { TD_POOL_ALL = 0, TD_POOL_SMALL, TD_POOL_LARGE, TD_POOL_COUNT } td_memory_pool;
typedef struct td_memory_stat {
    int64_t current, peak, allocated, freed;
} td_memory_stat;
typedef struct td_memory_stats {
    td_memory_stat stat[TD_STAT_FAMILY_COUNT][TD_POOL_COUNT];
    td_memory_stat oversize_allocations, oversize_segments;
    int64_t num_alloc_retries, num_ooms, num_sync_all_streams, num_device_alloc, num_device_free;
    int64_t max_split_size; /* -1: unlimited */
} td_memory_stats;
TD_API td_status td_memory_stats_get(td_device device, td_memory_stats *out);
/* A statistic by PyTorch's name ("allocated_bytes.small_pool.peak", "num_ooms");
 * TD_ERR_NOT_FOUND for an unknown name. */
TD_API td_status td_memory_stats_lookup(const td_memory_stats *stats, const char *key, int64_t *out);
/* The i-th statistic name in memory_stats' order, NULL past the last. */
TD_API const char *td_memory_stats_key(int i);
/* allocated_bytes.all.current / .peak, reserved_bytes.all.current / .peak; -1 on a bad device. */
TD_API int64_t td_memory_allocated(td_device device);
TD_API int64_t td_max_memory_allocated(td_device device);
TD_API int64_t td_memory_reserved(td_device device);
TD_API int64_t td_max_memory_reserved(td_device device);
/* Every peak becomes its current value. */
TD_API td_status td_memory_reset_peak_stats(td_device device);

typedef enum td_memory_block_state {
    TD_BLOCK_ACTIVE_ALLOCATED = 0,
    TD_BLOCK_ACTIVE_PENDING_FREE, /* freed, waiting for a recorded stream */
    TD_BLOCK_INACTIVE
} td_memory_block_state;
typedef struct td_memory_block {
    uint64_t address, size, requested_size;
    td_memory_block_state state;
} td_memory_block;
typedef struct td_memory_segment {
    td_device device;
    uint64_t address, total_size, allocated_size, active_size, requested_size;
    uint64_t stream_id;
    bool is_large; /* segment_type "large" (else "small") */
    bool is_expandable;
    size_t block_count;
    td_memory_block *blocks;
} td_memory_segment;
typedef struct td_memory_snapshot {
    size_t segment_count;
    td_memory_segment *segments;
} td_memory_snapshot;
/* Every segment of every device of a type, with stats taken under the same lock. */
TD_API td_status td_memory_snapshot_get(td_device_type type, td_memory_snapshot *out);
TD_API void td_memory_snapshot_free(td_memory_snapshot *snapshot);

/* ---- pinned host memory ------------------------------------------------------------------- *
 * Page-locked host memory (cuMemHostAlloc; plain host memory on sim), cached: sizes round up to a
 * power of two, and a freed block is reused only after the events recorded for it (by
 * asynchronous copies from or to it) have completed. */
TD_API td_status td_host_alloc(size_t nbytes, void **out);
TD_API void td_host_free(void *ptr);
/* ptr lies in a pinned block that s uses: the block's reuse waits for s's work queued so far. */
TD_API td_status td_host_record_stream(void *ptr, td_stream *s);
TD_API bool td_host_is_pinned(const void *ptr);
TD_API td_status td_host_empty_cache(void);

/* ---- lifetime and leak checks --------------------------------------------------------------- */

typedef struct td_device_live {
    int64_t streams;         /* created or wrapped streams not yet released */
    int64_t events;
    int64_t allocated_bytes; /* allocator bytes in use on every device */
    int64_t host_blocks;     /* pinned host blocks in use */
    int64_t threads;         /* sim stream threads running */
} td_device_live;
TD_API void td_device_live_get(td_device_live *out);
/* Tears the runtime down: empties the caches and stops the sim stream threads (CUDA's primary
 * contexts stay for the life of the process, as the CUDA runtime keeps them). Fails with TD_ERR_INVALID naming what is still live (streams, events, memory) and then
 * tears nothing down. The runtime starts again on its next use. */
TD_API td_status td_device_shutdown(void);

/* ---- random number generators (torch.cuda's get_rng_state, manual_seed, ...) --------------- *
 * One Philox4x32-10 generator per device, created at its first use with PyTorch's default seed
 * (67280421310721) and offset 0, and kept for the life of the process (td_device_shutdown leaves
 * it). Its state is 16 bytes, as modern PyTorch's CUDA generator state: the seed (uint64) then the
 * Philox offset (int64), both little-endian. Every random call (td_tensor_normal_,
 * td_tensor_uniform_) takes (seed, offset) under the generator's lock and advances the offset by
 * a fixed multiple of 4, so restoring a state replays the same calls bit for bit. Device arguments
 * take index -1 for the current device. */
#define TD_RNG_STATE_SIZE 16
#define TD_RNG_DEFAULT_SEED UINT64_C(67280421310721)

TD_API td_status td_device_rng_get_state(td_device device, uint8_t out[TD_RNG_STATE_SIZE]);
/* Sets seed and offset; an offset that is negative or not a multiple of 4 fails ("offset must be a
 * multiple of 4") and changes nothing. */
TD_API td_status td_device_rng_set_state(td_device device, const uint8_t state[TD_RNG_STATE_SIZE]);
/* The states of devices 0 .. td_device_count(type)-1 into out (room for capacity states);
 * *count: the number of devices. Fails when capacity is too small. */
TD_API td_status td_device_rng_get_state_all(td_device_type type, uint8_t (*out)[TD_RNG_STATE_SIZE], int capacity,
                                             int *count);
/* Sets the state of devices 0 .. n-1 (set_rng_state_all: one state per device given). */
TD_API td_status td_device_rng_set_state_all(td_device_type type, const uint8_t (*states)[TD_RNG_STATE_SIZE], int n);
/* torch.cuda._get_rng_state_offset / _set_rng_state_offset: the Philox offset alone. */
TD_API td_status td_device_rng_get_offset(td_device device, int64_t *out);
TD_API td_status td_device_rng_set_offset(td_device device, int64_t offset);
/* torch.cuda.manual_seed(seed) for one device / manual_seed_all for every device of a type: the
 * seed, and the offset back to 0. */
TD_API td_status td_device_manual_seed(td_device device, uint64_t seed);
TD_API td_status td_device_manual_seed_all(td_device_type type, uint64_t seed);
/* torch.cuda.initial_seed: the generator's current seed. */
TD_API td_status td_device_initial_seed(td_device device, uint64_t *out);

/* ---- tensors on devices -------------------------------------------------------------------- *
 * A device tensor's storage is device memory from the caching allocator, allocated for the
 * current stream of its device. Host-side access (td_tensor_data reads, td_tensor_get_*, printing,
 * the arithmetic ops other than those below) needs a CPU tensor: copy it there first. */

/* The tensor's device: {TD_DEVICE_CPU, -1} for host tensors. */
TD_API td_device td_tensor_device(const td_tensor *t);
/* Uninitialized, contiguous (strides NULL) or with the given strides, on device (index -1: the
 * current device of that type; cpu allowed). */
TD_API td_status td_tensor_empty_on(td_device device, td_dtype dtype, td_shape shape, const int64_t *strides,
                                    td_tensor **out);
TD_API td_status td_tensor_full_on(td_device device, td_dtype dtype, td_shape shape, double value, td_tensor **out);
/* t on device: t itself (a new reference) when it is already there, else a copy with the same
 * strides when t is dense and non-overlapping (memory_format=preserve), contiguous otherwise. */
TD_API td_status td_tensor_to_device(td_tensor *t, td_device device, bool non_blocking, td_tensor **out);
/* dst.copy_(src, non_blocking) across any two devices, with the contract of docs/devices.md:
 * between two devices the copy runs on the source device's current stream, after the
 * destination's current stream reaches the copy, and the destination's current stream waits for
 * it; on one device, on its current stream. Blocking copies to or from the host return when the
 * data has arrived; non-blocking ones with pinned host memory return at once. Same shape (src may
 * broadcast), dtypes must match across devices. dst == src does nothing. */
TD_API td_status td_tensor_copy_ex(td_tensor *dst, const td_tensor *src, bool non_blocking);
/* A copy of a host tensor in pinned memory. */
TD_API td_status td_tensor_pin_memory(const td_tensor *t, td_tensor **out);
TD_API bool td_tensor_is_pinned(const td_tensor *t);
/* The in-place version counter: bumped by every in-place write (copy, fill); views share it. */
TD_API uint64_t td_tensor_version(const td_tensor *t);
/* t.normal_(mean, std) / t.uniform_(from, to) on a device tensor of float16, bfloat16, float32 or
 * float64, queued on the current stream of its device with the device's generator (see "random
 * number generators" above). Errors as PyTorch's: "normal expects std >= 0.0, but found std -1",
 * "uniform_ expects to return a [from, to) range, but found from=2 > to=1". */
TD_API td_status td_tensor_normal_(td_tensor *t, double mean, double std);
TD_API td_status td_tensor_uniform_(td_tensor *t, double from, double to);

/* ---- saving and loading (torch.save / torch.load with map_location) ------------------------- *
 * A value (tensors anywhere inside lists, tuples, dicts and records) is saved with each tensor's
 * elements and its location, the literal "cpu", "cuda:N" or "sim:N" in a fixed 16-byte field that
 * no checksum covers (docs/protocols.md, "tdist save files"), so files can be edited as PyTorch's
 * tests edit theirs. Loading restores every tensor on its saved location unless map says
 * otherwise, and checks each target against the devices this process has before it allocates
 * anything: "Attempting to deserialize object on CUDA device 9 but torch.cuda.device_count() is 2.
 * Please use torch.load with map_location to map your storages to an existing device." (sim
 * devices: "SIM device" and "torch.sim"), or, with no device of the type at all, "Attempting to
 * deserialize object on a CUDA device but torch.cuda.is_available() is False. ...". A tensor saved
 * twice in one value loads as one tensor. */
typedef struct td_map_location_entry {
    const char *from; /* a saved location, "cuda:1" */
    const char *to;   /* where to restore it, "cuda:0", "cpu" ("cuda": the current device) */
} td_map_location_entry;
/* map_location. The first of these that is set decides for each saved tensor; with none set (or
 * map NULL) the tensor goes back to its saved location. */
typedef struct td_tensor_map_location {
    /* map_location=torch.device(...): every tensor goes here ("cpu", "cuda:0"). */
    const char *device;
    /* map_location={"cuda:1": "cuda:0"}: locations found here go to their `to`, others stay. */
    const td_map_location_entry *table;
    size_t table_len;
    /* map_location=fn: called with the saved location; returns true with *target set (index -1:
     * the current device), or false for the default (the saved location), as fn returning None. */
    bool (*fn)(const char *location, void *user, td_device *target);
    void *user;
} td_tensor_map_location;

TD_API td_status td_value_save(const td_value *v, const char *path);
/* The file's bytes in one malloc'd buffer (free with free()). */
TD_API td_status td_value_save_bytes(const td_value *v, void **data, size_t *len);
TD_API td_status td_value_load(const char *path, const td_tensor_map_location *map, td_value **out);
TD_API td_status td_value_load_bytes(const void *data, size_t len, const td_tensor_map_location *map,
                                     td_value **out);
/* One tensor: torch.save(t, path) / torch.load(path, map_location). */
TD_API td_status td_tensor_save(const td_tensor *t, const char *path);
TD_API td_status td_tensor_load(const char *path, const td_tensor_map_location *map, td_tensor **out);

/* ---- comm primitives (torch.cuda.comm) ------------------------------------------------------ *
 * Over device tensors of one type (and host tensors where PyTorch allows the CPU). Arrays of output
 * tensors are new references. The keyword combinations of PyTorch's Python functions (devices vs
 * out) are separate functions here, so "Exactly one of 'devices' and 'out'" cannot happen. */

/* One copy of src per device, in order; the entry for src's own device is src itself. */
TD_API td_status td_comm_broadcast(td_tensor *src, const td_device *devices, int ndevices, td_tensor **out);
/* Fills each outs[i] with src, in place. */
TD_API td_status td_comm_broadcast_out(td_tensor *src, td_tensor *const *outs, int nouts);
/* Broadcasts tensors (all on devices[0]) in flat buffers of at most buffer_size bytes per dtype
 * (0: 10 MiB); out[d * ntensors + i] is tensor i on devices[d]; the devices[0] row holds the
 * inputs themselves, the others own their storage. */
TD_API td_status td_comm_broadcast_coalesced(td_tensor *const *tensors, int ntensors, const td_device *devices,
                                             int ndevices, size_t buffer_size, td_tensor **out);
/* The sum of inputs (one per device, same shape and dtype) on destination (index -1: current). */
TD_API td_status td_comm_reduce_add(td_tensor *const *inputs, int ninputs, td_device destination, td_tensor **out);
/* inputs[d * ntensors + i]: tensor i on device d; out[i]: the sums on destination. */
TD_API td_status td_comm_reduce_add_coalesced(td_tensor *const *inputs, int ndevices, int ntensors,
                                              td_device destination, size_t buffer_size, td_tensor **out);
/* Splits src along dim into chunks (chunk_sizes, or torch.chunk's sizes when NULL) placed on
 * devices, copying on streams[i] when given; a chunk for src's own device is a view. *nout: how
 * many chunks (at most ndevices). */
TD_API td_status td_comm_scatter(td_tensor *src, const td_device *devices, int ndevices, const int64_t *chunk_sizes,
                                 int nchunk_sizes, int dim, td_stream *const *streams, td_tensor **out, int *nout);
/* Splits src into the given outputs (their sizes along dim). */
TD_API td_status td_comm_scatter_out(td_tensor *src, td_tensor *const *outs, int nouts, int dim,
                                     td_stream *const *streams);
/* Concatenates inputs along dim on destination (index -1: the current device; cpu allowed). */
TD_API td_status td_comm_gather(td_tensor *const *inputs, int ninputs, int dim, td_device destination,
                                td_tensor **out);
TD_API td_status td_comm_gather_out(td_tensor *const *inputs, int ninputs, int dim, td_tensor *out);

/* torch.nn.parallel.scatter_gather's scatter and gather over td_value trees (tdist/value.h).
 *
 * scatter splits every tensor of v along dim onto devices (td_comm_scatter with torch.chunk's
 * sizes) and rebuilds the structure around each device's piece: a record (namedtuple) becomes
 * one record per device with the same tag and fields; a non-empty tuple one tuple per device; a
 * non-empty list one list per device; a non-empty dict one dict per device (keys go through the
 * same recursion, so a non-tensor key is shared); anything else (None, numbers, strings, empty
 * containers) is replicated: each out[i] is another reference to it. As upstream zips the
 * pieces, a container yields as many values as its shortest member (a tensor of 3 rows over 4
 * devices gives 3 pieces), and an empty record yields none. *nout: how many values out[] holds (at
 * most ndevices), each a new reference.
 *
 * gather is its inverse: outputs[0 .. n-1] (one value per device, same structure) become one
 * value with each tensor gathered along dim onto destination (td_comm_gather: cpu allowed, index
 * -1 the current device of that type). Tensors -> one tensor (0-dim tensors along dim 0 are
 * unsqueezed into a vector, with PyTorch's warning; host tensors fail with "Gather function not
 * implemented for CPU tensors"); None -> None; dict -> dict with outputs[0]'s keys in its order
 * ("All dicts must have the same number of keys"); record -> record of the same tag; tuple ->
 * tuple and list -> list of the element-wise gathers, as long as the shortest output. Other
 * values (numbers, strings, bytes) cannot be gathered and fail with TD_ERR_INVALID, as do outputs
 * whose kinds differ at one place of the structure. Containers nest at most TD_VALUE_MAX_DEPTH
 * deep. */
TD_API td_status td_comm_scatter_value(const td_value *v, const td_device *devices, int ndevices, int dim,
                                       td_value **out, int *nout);
TD_API td_status td_comm_gather_value(const td_value *const *outputs, int n, int dim, td_device destination,
                                      td_value **out);

#ifdef __cplusplus
}
#endif
#endif
