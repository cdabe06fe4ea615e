/* The caching device allocator (torch.cuda's native CUDACachingAllocator) and its statistics.
 *
 * Each device of each accelerator type has one allocator state under its own mutex: segments
 * obtained from the implementation's device_malloc, split into blocks; free blocks sit in one of two
 * pools (small: requests up to 1 MiB, 2 MiB segments; large: 20 MiB segments below 10 MiB, else
 * rounded to 2 MiB) ordered by (stream, size, address), so a request takes the best fit among the
 * free blocks of its own stream. Freed blocks merge with free neighbours. A block recorded on other
 * streams (td_device_record_stream) waits, when freed, for native events recorded on those streams
 * ("active_pending_free"); later mallocs, empty_cache and shutdown poll them. The statistics follow
 * PyTorch's update rule family x pool and are changed under the same mutex as the blocks, so a
 * snapshot and the stats read under that mutex always agree (spec 2.4).
 *
 * Locks: a global mutex guards the pointer map (td_device_free finds a block by address); it may
 * be taken before a device mutex, never after. No lock is held across a blocking wait or across
 * the implementation's device_malloc / device_free: segments are obtained and given back outside
 * the device mutex. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "base/map.h"
#include "base/vec.h"
#include "device/device_impl.h"

/* PyTorch's sizing constants (c10/cuda/CUDACachingAllocator.cpp). */
#define ALLOC_MIN_BLOCK ((size_t)512)
#define ALLOC_SMALL_SIZE ((size_t)1 << 20)
#define ALLOC_SMALL_BUFFER ((size_t)2 << 20)
#define ALLOC_LARGE_BUFFER ((size_t)20 << 20)
#define ALLOC_MIN_LARGE ((size_t)10 << 20)
#define ALLOC_ROUND_LARGE ((size_t)2 << 20)

#define ALLOC_TYPE_SLOTS 3 /* indexed by td_device_type; cpu unused */

typedef struct alloc_device alloc_device;
typedef struct alloc_segment alloc_segment;

/* A native event a freed block waits for. */
typedef struct alloc_event {
    const device_impl *impl;
    int index;
    void *native;
} alloc_event;

typedef struct alloc_block {
    alloc_segment *segment;
    uintptr_t address;
    size_t size;      /* rounded: a multiple of 512 */
    size_t requested; /* the caller's bytes while active, 0 when inactive */
    bool allocated;   /* active_allocated */
    bool in_pool;     /* inactive, in its pool's free set */
    struct alloc_block *prev, *next; /* neighbours in the segment, by address */
    TD_VEC(td_stream *) uses;        /* streams recorded while allocated (references) */
    TD_VEC(alloc_event) events;      /* while active_pending_free */
} alloc_block;

struct alloc_segment {
    alloc_device *device;
    uintptr_t base;
    size_t size;
    uint64_t stream_id;
    bool is_small;
    alloc_block *head; /* the lowest block */
};

typedef TD_VEC(alloc_block *) alloc_block_vec;

struct alloc_device {
    pthread_mutex_t lock;
    td_device_type type;
    int index;
    bool used;
    td_memory_stats stats;
    alloc_block_vec pools[2]; /* [is_small]: free blocks sorted by (stream, size, address) */
    TD_VEC(alloc_segment *) segments;
    alloc_block_vec pending;  /* freed blocks waiting for their events */
};

static alloc_device devices[ALLOC_TYPE_SLOTS][DEVICE_MAX_DEVICES];
static pthread_once_t devices_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t pointers_lock = PTHREAD_MUTEX_INITIALIZER;
static td_map pointers = TD_MAP_INIT; /* address -> allocated block */

static void devices_init(void)
{
    for (int t = 0; t < ALLOC_TYPE_SLOTS; t++)
        for (int i = 0; i < DEVICE_MAX_DEVICES; i++) {
            alloc_device *d = &devices[t][i];
            pthread_mutex_init(&d->lock, NULL);
            d->type = (td_device_type)t;
            d->index = i;
            d->stats.max_split_size = -1;
        }
}

static alloc_device *device_state(td_device_type type, int index)
{
    pthread_once(&devices_once, devices_init);
    return &devices[type][index];
}

/* Resolves a device argument to its state (index -1: current device). */
static td_status device_lookup(td_device device, alloc_device **out, const device_impl **impl_out)
{
    const device_impl *impl;
    int index;
    td_status st = device_check(device, &impl, &index);
    if (st != TD_OK)
        return st;
    *out = device_state(device.type, index);
    if (impl_out)
        *impl_out = impl;
    return TD_OK;
}

/* ---- statistics ----------------------------------------------------------------------------- */

static void stat_update(td_memory_stat *s, int64_t amount)
{
    s->current += amount;
    if (s->current < 0) {
        TD_LOG_ERROR("Negative tracked stat in CUDA allocator (likely logic error).");
        s->current = 0;
    }
    if (s->current > s->peak)
        s->peak = s->current;
    if (amount > 0)
        s->allocated += amount;
    else
        s->freed -= amount;
}

/* Updates the "all" pool and the block's own pool. */
static void stats_update(alloc_device *d, td_memory_stat_family family, bool is_small, int64_t amount)
{
    stat_update(&d->stats.stat[family][TD_POOL_ALL], amount);
    stat_update(&d->stats.stat[family][is_small ? TD_POOL_SMALL : TD_POOL_LARGE], amount);
}

static void stat_reset_peak(td_memory_stat *s) { s->peak = s->current; }

/* ---- free sets: sorted by (stream, size, address) -------------------------------------------- */

static int block_cmp(uint64_t stream_a, size_t size_a, uintptr_t addr_a, const alloc_block *b)
{
    if (stream_a != b->segment->stream_id)
        return stream_a < b->segment->stream_id ? -1 : 1;
    if (size_a != b->size)
        return size_a < b->size ? -1 : 1;
    if (addr_a != b->address)
        return addr_a < b->address ? -1 : 1;
    return 0;
}

/* The first position whose block is not less than (stream, size, address). */
static size_t pool_lower_bound(const alloc_block_vec *pool, uint64_t stream, size_t size, uintptr_t address)
{
    size_t lo = 0, hi = pool->len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (block_cmp(stream, size, address, pool->items[mid]) > 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void pool_insert(alloc_device *d, alloc_block *b)
{
    alloc_block_vec *pool = &d->pools[b->segment->is_small];
    size_t at = pool_lower_bound(pool, b->segment->stream_id, b->size, b->address);
    TD_VEC_RESERVE(pool, pool->len + 1);
    memmove(&pool->items[at + 1], &pool->items[at], (pool->len - at) * sizeof(pool->items[0]));
    pool->items[at] = b;
    pool->len++;
    b->in_pool = true;
}

static void pool_remove(alloc_device *d, alloc_block *b)
{
    alloc_block_vec *pool = &d->pools[b->segment->is_small];
    size_t at = pool_lower_bound(pool, b->segment->stream_id, b->size, b->address);
    if (at >= pool->len || pool->items[at] != b) {
        TD_LOG_ERROR("caching allocator: a free block is missing from its pool (logic error)");
        return;
    }
    memmove(&pool->items[at], &pool->items[at + 1], (pool->len - at - 1) * sizeof(pool->items[0]));
    pool->len--;
    b->in_pool = false;
}

/* Best fit: the smallest free block of the stream's pool that holds size. */
static alloc_block *pool_find(alloc_device *d, bool is_small, uint64_t stream, size_t size)
{
    alloc_block_vec *pool = &d->pools[is_small];
    size_t at = pool_lower_bound(pool, stream, size, 0);
    if (at < pool->len && pool->items[at]->segment->stream_id == stream)
        return pool->items[at];
    return NULL;
}

/* ---- sizing --------------------------------------------------------------------------------- */

static size_t round_size(size_t nbytes)
{
    if (nbytes < ALLOC_MIN_BLOCK)
        return ALLOC_MIN_BLOCK;
    return ALLOC_MIN_BLOCK * ((nbytes + ALLOC_MIN_BLOCK - 1) / ALLOC_MIN_BLOCK);
}

static size_t segment_size_for(size_t size)
{
    if (size <= ALLOC_SMALL_SIZE)
        return ALLOC_SMALL_BUFFER;
    if (size < ALLOC_MIN_LARGE)
        return ALLOC_LARGE_BUFFER;
    return ALLOC_ROUND_LARGE * ((size + ALLOC_ROUND_LARGE - 1) / ALLOC_ROUND_LARGE);
}

static bool should_split(const alloc_block *b, size_t size)
{
    size_t remaining = b->size - size;
    if (b->segment->is_small)
        return remaining >= ALLOC_MIN_BLOCK;
    return remaining > ALLOC_SMALL_SIZE;
}

/* "20.00 MiB", as c10's format_size. */
static void format_size(uint64_t n, char *buf, size_t len)
{
    if (n <= 1024)
        snprintf(buf, len, "%" PRIu64 " bytes", n);
    else if (n <= 1048576)
        snprintf(buf, len, "%.2f KiB", (double)n / 1024.0);
    else if (n <= 1073741824)
        snprintf(buf, len, "%.2f MiB", (double)n / 1048576.0);
    else
        snprintf(buf, len, "%.2f GiB", (double)n / 1073741824.0);
}

/* ---- blocks --------------------------------------------------------------------------------- */

static bool block_is_split(const alloc_block *b) { return b->prev || b->next; }

/* Hands out block b (free, possibly fresh from a new segment) for size rounded bytes of which the
 * caller asked for requested; splits off the rest when the pool's rule says so. Under d->lock. */
static alloc_block *block_take(alloc_device *d, alloc_block *b, size_t size, size_t requested)
{
    bool is_small = b->segment->is_small;
    bool already_split = block_is_split(b);
    if (b->in_pool)
        pool_remove(d, b);
    if (should_split(b, size)) {
        alloc_block *rest = TD_NEW(alloc_block);
        rest->segment = b->segment;
        rest->address = b->address + size;
        rest->size = b->size - size;
        rest->prev = b;
        rest->next = b->next;
        if (rest->next)
            rest->next->prev = rest;
        b->next = rest;
        b->size = size;
        pool_insert(d, rest);
        if (already_split) {
            /* An inactive split block shrinks by size bytes. */
            stats_update(d, TD_STAT_INACTIVE_SPLIT_BYTES, is_small, -(int64_t)size);
        } else {
            /* A new inactive split block of rest->size bytes. */
            stats_update(d, TD_STAT_INACTIVE_SPLIT_BYTES, is_small, (int64_t)rest->size);
            stats_update(d, TD_STAT_INACTIVE_SPLIT, is_small, 1);
        }
    } else if (already_split) {
        stats_update(d, TD_STAT_INACTIVE_SPLIT_BYTES, is_small, -(int64_t)b->size);
        stats_update(d, TD_STAT_INACTIVE_SPLIT, is_small, -1);
    }
    b->allocated = true;
    b->requested = requested;
    stats_update(d, TD_STAT_ALLOCATION, is_small, 1);
    stats_update(d, TD_STAT_ALLOCATED_BYTES, is_small, (int64_t)b->size);
    stats_update(d, TD_STAT_ACTIVE, is_small, 1);
    stats_update(d, TD_STAT_ACTIVE_BYTES, is_small, (int64_t)b->size);
    stats_update(d, TD_STAT_REQUESTED_BYTES, is_small, (int64_t)requested);
    return b;
}

/* Merges free neighbour src into dst; returns the bytes taken over (0 when src is not free). */
static size_t block_merge(alloc_device *d, alloc_block *dst, alloc_block *src)
{
    if (!src || !src->in_pool)
        return 0;
    pool_remove(d, src);
    if (dst->prev == src) {
        dst->address = src->address;
        dst->prev = src->prev;
        if (dst->prev)
            dst->prev->next = dst;
        else
            dst->segment->head = dst;
    } else {
        dst->next = src->next;
        if (dst->next)
            dst->next->prev = dst;
    }
    size_t subsumed = src->size;
    dst->size += subsumed;
    free(src);
    return subsumed;
}

/* An active block (allocated, or pending with its events done) becomes inactive: it merges with its
 * free neighbours and returns to its pool. Under d->lock. */
static void block_release(alloc_device *d, alloc_block *b)
{
    bool is_small = b->segment->is_small;
    size_t original_size = b->size;
    size_t requested = b->requested;
    int64_t split_blocks = 0, split_bytes = 0;
    alloc_block *neighbours[2] = {b->prev, b->next};
    for (int i = 0; i < 2; i++) {
        size_t subsumed = block_merge(d, b, neighbours[i]);
        if (subsumed > 0) {
            split_blocks -= 1;
            split_bytes -= (int64_t)subsumed;
        }
    }
    b->requested = 0;
    pool_insert(d, b);
    if (block_is_split(b)) {
        split_blocks += 1;
        split_bytes += (int64_t)b->size;
    }
    stats_update(d, TD_STAT_INACTIVE_SPLIT, is_small, split_blocks);
    stats_update(d, TD_STAT_INACTIVE_SPLIT_BYTES, is_small, split_bytes);
    stats_update(d, TD_STAT_ACTIVE, is_small, -1);
    stats_update(d, TD_STAT_ACTIVE_BYTES, is_small, -(int64_t)original_size);
    stats_update(d, TD_STAT_REQUESTED_BYTES, is_small, -(int64_t)requested);
}

static const device_impl *impl_of_device(const alloc_device *d) { return device_impl_of(d->type); }

/* Pending blocks whose events have all completed go back to their pools. Never waits. Under
 * d->lock. */
static void pending_poll(alloc_device *d)
{
    for (size_t i = 0; i < d->pending.len;) {
        alloc_block *b = d->pending.items[i];
        for (size_t e = 0; e < b->events.len;) {
            alloc_event *ev = &b->events.items[e];
            if (ev->impl->event_query(ev->index, ev->native) != 0) { /* done, or failed: nothing to wait for */
                ev->impl->event_destroy(ev->index, ev->native);
                TD_VEC_SWAP_REMOVE(&b->events, e);
            } else {
                e++;
            }
        }
        if (b->events.len == 0) {
            TD_VEC_FREE(&b->events);
            TD_VEC_SWAP_REMOVE(&d->pending, i);
            block_release(d, b);
        } else {
            i++;
        }
    }
}

/* Waits (without any lock) for every event of the device's pending blocks, then returns those
 * blocks to their pools. The blocks are taken off the pending list first, so no other thread
 * destroys their events meanwhile; they stay active_pending_free in snapshots until done. */
static void pending_drain(alloc_device *d)
{
    pthread_mutex_lock(&d->lock);
    alloc_block_vec taken = {0};
    taken.items = d->pending.items;
    taken.len = d->pending.len;
    taken.cap = d->pending.cap;
    memset(&d->pending, 0, sizeof d->pending);
    pthread_mutex_unlock(&d->lock);
    if (taken.len == 0) {
        TD_VEC_FREE(&taken);
        return;
    }
    for (size_t i = 0; i < taken.len; i++) {
        alloc_block *b = taken.items[i];
        for (size_t e = 0; e < b->events.len; e++) {
            alloc_event *ev = &b->events.items[e];
            (void)ev->impl->event_synchronize(ev->index, ev->native);
        }
    }
    pthread_mutex_lock(&d->lock);
    for (size_t i = 0; i < taken.len; i++) {
        alloc_block *b = taken.items[i];
        for (size_t e = 0; e < b->events.len; e++)
            b->events.items[e].impl->event_destroy(b->events.items[e].index, b->events.items[e].native);
        TD_VEC_FREE(&b->events);
        block_release(d, b);
    }
    pthread_mutex_unlock(&d->lock);
    TD_VEC_FREE(&taken);
}

/* A segment to hand back to the implementation once the device lock is dropped. */
typedef struct alloc_release {
    uintptr_t base;
} alloc_release;
typedef TD_VEC(alloc_release) alloc_release_vec;

/* Takes every wholly free segment off the device (stats updated) into out. Under d->lock. */
static void segments_collect_free(alloc_device *d, alloc_release_vec *out)
{
    for (size_t i = 0; i < d->segments.len;) {
        alloc_segment *seg = d->segments.items[i];
        alloc_block *head = seg->head;
        if (head->in_pool && !head->next) {
            pool_remove(d, head);
            stats_update(d, TD_STAT_SEGMENT, seg->is_small, -1);
            stats_update(d, TD_STAT_RESERVED_BYTES, seg->is_small, -(int64_t)seg->size);
            d->stats.num_device_free++;
            alloc_release r = {seg->base};
            TD_VEC_PUSH(out, r);
            free(head);
            free(seg);
            TD_VEC_SWAP_REMOVE(&d->segments, i);
        } else {
            i++;
        }
    }
}

static void segments_free_native(const alloc_device *d, alloc_release_vec *list)
{
    const device_impl *impl = impl_of_device(d);
    for (size_t i = 0; i < list->len; i++)
        impl->device_free(d->index, (void *)list->items[i].base);
    TD_VEC_FREE(list);
}

/* Releases the device's free segments (after its pending blocks are done when wait is set). */
static void device_release_cached(alloc_device *d, bool wait, bool count_sync)
{
    if (wait)
        pending_drain(d);
    alloc_release_vec list = {0};
    pthread_mutex_lock(&d->lock);
    pending_poll(d);
    if (count_sync)
        d->stats.num_sync_all_streams++;
    segments_collect_free(d, &list);
    pthread_mutex_unlock(&d->lock);
    segments_free_native(d, &list);
}

/* ---- malloc / free -------------------------------------------------------------------------- */

/* PyTorch's OOM message: "CUDA out of memory. Tried to allocate <segment size>." then the
 * implementation's own text (less its copy of that first sentence, cuda's names the GPU's capacity),
 * the device's capacity where that text does not, and what the cache holds. */
static td_status out_of_memory(alloc_device *d, const device_impl *impl, size_t alloc_size, const char *impl_text)
{
    pthread_mutex_lock(&d->lock);
    d->stats.num_ooms++;
    int64_t allocated = d->stats.stat[TD_STAT_ALLOCATED_BYTES][TD_POOL_ALL].current;
    int64_t reserved = d->stats.stat[TD_STAT_RESERVED_BYTES][TD_POOL_ALL].current;
    pthread_mutex_unlock(&d->lock);
    static const char prefix[] = "CUDA out of memory. Tried to allocate ";
    const char *rest = impl_text;
    if (strncmp(rest, prefix, sizeof prefix - 1) == 0) {
        const char *end = strstr(rest + sizeof prefix - 1, ". ");
        rest = end ? end + 2 : "";
    }
    char want[32], alloc_s[32], unalloc_s[32], capacity[160] = "";
    format_size(alloc_size, want, sizeof want);
    format_size((uint64_t)allocated, alloc_s, sizeof alloc_s);
    format_size((uint64_t)(reserved - allocated), unalloc_s, sizeof unalloc_s);
    bool impl_names_capacity = strstr(rest, "total capacity") != NULL;
    if (!impl_names_capacity) {
        size_t free_bytes = 0, total_bytes = 0;
        char total[32], avail[32];
        (void)impl->mem_get_info(d->index, &free_bytes, &total_bytes);
        format_size(total_bytes, total, sizeof total);
        format_size(free_bytes, avail, sizeof avail);
        snprintf(capacity, sizeof capacity, "GPU %d has a total capacity of %s of which %s is free. ", d->index, total,
                 avail);
    }
    return error_fmt(TD_ERR_NOMEM,
                     "CUDA out of memory. Tried to allocate %s. %s%s%sOf the allocated memory %s is allocated by "
                     "tdist, and %s is reserved by tdist but unallocated.%s%s%s",
                     want, capacity, impl_names_capacity ? rest : "", impl_names_capacity ? " " : "", alloc_s,
                     unalloc_s, !impl_names_capacity && *rest ? " (" : "", impl_names_capacity ? "" : rest,
                     !impl_names_capacity && *rest ? ")" : "");
}

/* A new segment of alloc_size bytes for stream; on TD_ERR_NOMEM releases the device's cached
 * segments and tries once more. */
static td_status segment_obtain(alloc_device *d, const device_impl *impl, size_t alloc_size, void **out)
{
    td_status st = impl->device_malloc(d->index, alloc_size, out);
    if (st != TD_ERR_NOMEM)
        return st;
    pthread_mutex_lock(&d->lock);
    d->stats.num_alloc_retries++;
    pthread_mutex_unlock(&d->lock);
    device_release_cached(d, true, false);
    st = impl->device_malloc(d->index, alloc_size, out);
    if (st != TD_ERR_NOMEM)
        return st;
    char *text = alloc_strdup(td_last_error());
    st = out_of_memory(d, impl, alloc_size, text);
    free(text);
    return st;
}

static void pointers_put(alloc_block *b)
{
    uintptr_t key = b->address;
    pthread_mutex_lock(&pointers_lock);
    map_put(&pointers, &key, sizeof key, b);
    pthread_mutex_unlock(&pointers_lock);
}

td_status td_device_malloc(td_device device, size_t nbytes, td_stream *stream, void **out)
{
    if (!out)
        return error_set(TD_ERR_INVALID, "td_device_malloc: out must not be NULL");
    *out = NULL;
    alloc_device *d;
    const device_impl *impl;
    TD_TRY(device_lookup(device, &d, &impl));
    if (nbytes == 0)
        return TD_OK;
    td_device resolved = {device.type, d->index};
    if (!stream)
        stream = device_current_stream(resolved);
    else if (!td_device_equal(stream->device, resolved)) {
        char want[32], got[32];
        return error_fmt(TD_ERR_INVALID, "td_device_malloc: the stream is on %s, but the memory is for %s",
                         td_device_str(stream->device, got, sizeof got), td_device_str(resolved, want, sizeof want));
    }
    if (nbytes > SIZE_MAX / 2) {
        char want[32];
        format_size(nbytes, want, sizeof want);
        pthread_mutex_lock(&d->lock);
        d->stats.num_ooms++;
        pthread_mutex_unlock(&d->lock);
        return error_fmt(TD_ERR_NOMEM, "CUDA out of memory. Tried to allocate %s. GPU %d cannot hold it.", want,
                         d->index);
    }
    size_t size = round_size(nbytes);
    bool is_small = size <= ALLOC_SMALL_SIZE;
    uint64_t stream_id = stream->id;

    pthread_mutex_lock(&d->lock);
    d->used = true;
    pending_poll(d);
    alloc_block *b = pool_find(d, is_small, stream_id, size);
    if (b)
        block_take(d, b, size, nbytes);
    pthread_mutex_unlock(&d->lock);

    if (!b) {
        size_t alloc_size = segment_size_for(size);
        void *base = NULL;
        TD_TRY(segment_obtain(d, impl, alloc_size, &base));
        alloc_segment *seg = TD_NEW(alloc_segment);
        seg->device = d;
        seg->base = (uintptr_t)base;
        seg->size = alloc_size;
        seg->stream_id = stream_id;
        seg->is_small = is_small;
        b = TD_NEW(alloc_block);
        b->segment = seg;
        b->address = seg->base;
        b->size = alloc_size;
        seg->head = b;
        pthread_mutex_lock(&d->lock);
        TD_VEC_PUSH(&d->segments, seg);
        stats_update(d, TD_STAT_SEGMENT, is_small, 1);
        stats_update(d, TD_STAT_RESERVED_BYTES, is_small, (int64_t)alloc_size);
        d->stats.num_device_alloc++;
        block_take(d, b, size, nbytes);
        pthread_mutex_unlock(&d->lock);
    }
    pointers_put(b);
    *out = (void *)b->address;
    return TD_OK;
}

void td_device_free(void *ptr)
{
    if (!ptr)
        return;
    uintptr_t key = (uintptr_t)ptr;
    pthread_mutex_lock(&pointers_lock);
    alloc_block *b = map_remove(&pointers, &key, sizeof key);
    pthread_mutex_unlock(&pointers_lock);
    if (!b) {
        TD_LOG_ERROR("td_device_free: %p was not allocated by td_device_malloc (or was freed already)", ptr);
        return;
    }
    alloc_device *d = b->segment->device;
    /* The block is ours alone now (no longer in the map): record its events without any lock. */
    TD_VEC(alloc_event) events = {0};
    for (size_t i = 0; i < b->uses.len; i++) {
        td_stream *s = b->uses.items[i];
        const device_impl *impl = device_impl_of(s->device.type);
        alloc_event ev = {impl, s->device.index, NULL};
        td_status st = impl->event_create(ev.index, TD_EVENT_DEFAULT, &ev.native);
        if (st == TD_OK) {
            st = impl->event_record(ev.index, ev.native, s->native);
            if (st != TD_OK)
                impl->event_destroy(ev.index, ev.native);
        }
        if (st == TD_OK) {
            TD_VEC_PUSH(&events, ev);
        } else {
            /* No event to poll: wait for the stream instead (no lock is held). */
            TD_LOG_WARN("td_device_free: recording an event failed (%s); synchronizing the stream", td_last_error());
            (void)impl->stream_synchronize(ev.index, s->native);
        }
        td_stream_release(s);
    }
    TD_VEC_FREE(&b->uses);

    pthread_mutex_lock(&d->lock);
    bool is_small = b->segment->is_small;
    b->allocated = false;
    stats_update(d, TD_STAT_ALLOCATION, is_small, -1);
    stats_update(d, TD_STAT_ALLOCATED_BYTES, is_small, -(int64_t)b->size);
    if (events.len > 0) {
        b->events.items = events.items;
        b->events.len = events.len;
        b->events.cap = events.cap;
        TD_VEC_PUSH(&d->pending, b);
    } else {
        block_release(d, b);
    }
    pthread_mutex_unlock(&d->lock);
}

td_status td_device_record_stream(void *ptr, td_stream *s)
{
    if (!s)
        return error_set(TD_ERR_INVALID, "td_device_record_stream: the stream must not be NULL");
    uintptr_t key = (uintptr_t)ptr;
    pthread_mutex_lock(&pointers_lock);
    alloc_block *b = ptr ? map_get(&pointers, &key, sizeof key) : NULL;
    if (!b) {
        pthread_mutex_unlock(&pointers_lock);
        return error_fmt(TD_ERR_INVALID, "td_device_record_stream: %p is not memory allocated by td_device_malloc",
                         ptr);
    }
    alloc_device *d = b->segment->device;
    td_status st = TD_OK;
    pthread_mutex_lock(&d->lock);
    if (s->device.type != d->type) {
        char got[32];
        st = error_fmt(TD_ERR_INVALID, "td_device_record_stream: the memory is on a %s device, the stream on %s",
                       td_device_type_name(d->type), td_device_str(s->device, got, sizeof got));
    } else if (!(s->device.index == d->index && s->id == b->segment->stream_id)) {
        /* The allocation stream itself needs no event. */
        bool known = false;
        for (size_t i = 0; i < b->uses.len && !known; i++)
            known = td_stream_equal(b->uses.items[i], s);
        if (!known)
            TD_VEC_PUSH(&b->uses, td_stream_retain(s));
    }
    pthread_mutex_unlock(&d->lock);
    pthread_mutex_unlock(&pointers_lock);
    return st;
}

/* Calls fn on every device state that has been used. */
static void for_each_used(void (*fn)(alloc_device *d))
{
    pthread_once(&devices_once, devices_init);
    for (int t = 0; t < ALLOC_TYPE_SLOTS; t++)
        for (int i = 0; i < DEVICE_MAX_DEVICES; i++) {
            alloc_device *d = &devices[t][i];
            pthread_mutex_lock(&d->lock);
            bool used = d->used;
            pthread_mutex_unlock(&d->lock);
            if (used)
                fn(d);
        }
}

/* Every device of both types counts the call (num_sync_all_streams), as PyTorch's allocator
 * exists for each device from its lazy init on; only used ones have anything to release. */
td_status td_device_empty_cache(void)
{
    pthread_once(&devices_once, devices_init);
    static const td_device_type types[] = {TD_DEVICE_CUDA, TD_DEVICE_SIM};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int count = device_impl_of(types[t])->count();
        for (int i = 0; i < DEVICE_MAX_DEVICES; i++) {
            alloc_device *d = &devices[types[t]][i];
            pthread_mutex_lock(&d->lock);
            bool used = d->used;
            pthread_mutex_unlock(&d->lock);
            if (used || i < count)
                device_release_cached(d, used, true);
        }
    }
    return TD_OK;
}

static int64_t release_all_allocated;

static void release_one(alloc_device *d)
{
    device_release_cached(d, true, false);
    pthread_mutex_lock(&d->lock);
    release_all_allocated += d->stats.stat[TD_STAT_ALLOCATED_BYTES][TD_POOL_ALL].current;
    pthread_mutex_unlock(&d->lock);
}

int64_t device_allocator_release_all(void)
{
    static pthread_mutex_t release_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&release_lock);
    release_all_allocated = 0;
    for_each_used(release_one);
    int64_t total = release_all_allocated;
    pthread_mutex_unlock(&release_lock);
    return total;
}

/* ---- statistics: the public side -------------------------------------------------------------- */

td_status td_memory_stats_get(td_device device, td_memory_stats *out)
{
    alloc_device *d;
    TD_TRY(device_lookup(device, &d, NULL));
    pthread_mutex_lock(&d->lock);
    *out = d->stats;
    pthread_mutex_unlock(&d->lock);
    return TD_OK;
}

/* Stat names: memory_stats() flattens and sorts its keys, so the table is sorted by name. */
typedef struct stat_key {
    char name[48];
    size_t offset; /* of the int64_t in td_memory_stats */
} stat_key;

#define STAT_KEY_COUNT (TD_STAT_FAMILY_COUNT * TD_POOL_COUNT * 4 + 2 * 4 + 6)
static stat_key stat_keys[STAT_KEY_COUNT];
static pthread_once_t stat_keys_once = PTHREAD_ONCE_INIT;

static const char *const family_names[TD_STAT_FAMILY_COUNT] = {
    "allocation",     "segment",          "active",       "inactive_split",       "allocated_bytes",
    "reserved_bytes", "active_bytes",     "inactive_split_bytes", "requested_bytes",
};
static const char *const pool_names[TD_POOL_COUNT] = {"all", "small_pool", "large_pool"};
static const char *const metric_names[4] = {"current", "peak", "allocated", "freed"};

static size_t metric_offset(const td_memory_stat *base_stat, int metric, const td_memory_stats *base)
{
    const int64_t *fields[4] = {&base_stat->current, &base_stat->peak, &base_stat->allocated, &base_stat->freed};
    return (size_t)((const char *)fields[metric] - (const char *)base);
}

static int stat_key_cmp(const void *a, const void *b)
{
    return strcmp(((const stat_key *)a)->name, ((const stat_key *)b)->name);
}

static void stat_keys_init(void)
{
    static const td_memory_stats s;
    size_t n = 0;
    for (int f = 0; f < TD_STAT_FAMILY_COUNT; f++)
        for (int p = 0; p < TD_POOL_COUNT; p++)
            for (int m = 0; m < 4; m++) {
                snprintf(stat_keys[n].name, sizeof stat_keys[n].name, "%s.%s.%s", family_names[f], pool_names[p],
                         metric_names[m]);
                stat_keys[n++].offset = metric_offset(&s.stat[f][p], m, &s);
            }
    for (int m = 0; m < 4; m++) {
        snprintf(stat_keys[n].name, sizeof stat_keys[n].name, "oversize_allocations.%s", metric_names[m]);
        stat_keys[n++].offset = metric_offset(&s.oversize_allocations, m, &s);
        snprintf(stat_keys[n].name, sizeof stat_keys[n].name, "oversize_segments.%s", metric_names[m]);
        stat_keys[n++].offset = metric_offset(&s.oversize_segments, m, &s);
    }
    const struct {
        const char *name;
        const int64_t *field;
    } scalars[] = {
        {"num_alloc_retries", &s.num_alloc_retries},       {"num_ooms", &s.num_ooms},
        {"num_sync_all_streams", &s.num_sync_all_streams}, {"num_device_alloc", &s.num_device_alloc},
        {"num_device_free", &s.num_device_free},           {"max_split_size", &s.max_split_size},
    };
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++) {
        snprintf(stat_keys[n].name, sizeof stat_keys[n].name, "%s", scalars[i].name);
        stat_keys[n++].offset = (size_t)((const char *)scalars[i].field - (const char *)&s);
    }
    qsort(stat_keys, n, sizeof stat_keys[0], stat_key_cmp);
}

const char *td_memory_stats_key(int i)
{
    pthread_once(&stat_keys_once, stat_keys_init);
    if (i < 0 || i >= STAT_KEY_COUNT)
        return NULL;
    return stat_keys[i].name;
}

td_status td_memory_stats_lookup(const td_memory_stats *stats, const char *key, int64_t *out)
{
    pthread_once(&stat_keys_once, stat_keys_init);
    if (!stats || !key || !out)
        return error_set(TD_ERR_INVALID, "td_memory_stats_lookup: stats, key and out must not be NULL");
    stat_key probe;
    snprintf(probe.name, sizeof probe.name, "%s", key);
    const stat_key *found = strlen(key) < sizeof probe.name
                                ? bsearch(&probe, stat_keys, STAT_KEY_COUNT, sizeof stat_keys[0], stat_key_cmp)
                                : NULL;
    if (!found)
        return error_fmt(TD_ERR_NOT_FOUND, "memory_stats has no statistic named '%s'", key);
    memcpy(out, (const char *)stats + found->offset, sizeof *out);
    return TD_OK;
}

static int64_t stat_read(td_device device, td_memory_stat_family family, bool peak)
{
    alloc_device *d;
    if (device_lookup(device, &d, NULL) != TD_OK)
        return -1;
    pthread_mutex_lock(&d->lock);
    const td_memory_stat *s = &d->stats.stat[family][TD_POOL_ALL];
    int64_t v = peak ? s->peak : s->current;
    pthread_mutex_unlock(&d->lock);
    return v;
}

int64_t td_memory_allocated(td_device device) { return stat_read(device, TD_STAT_ALLOCATED_BYTES, false); }
int64_t td_max_memory_allocated(td_device device) { return stat_read(device, TD_STAT_ALLOCATED_BYTES, true); }
int64_t td_memory_reserved(td_device device) { return stat_read(device, TD_STAT_RESERVED_BYTES, false); }
int64_t td_max_memory_reserved(td_device device) { return stat_read(device, TD_STAT_RESERVED_BYTES, true); }

td_status td_memory_reset_peak_stats(td_device device)
{
    alloc_device *d;
    TD_TRY(device_lookup(device, &d, NULL));
    pthread_mutex_lock(&d->lock);
    for (int f = 0; f < TD_STAT_FAMILY_COUNT; f++)
        for (int p = 0; p < TD_POOL_COUNT; p++)
            stat_reset_peak(&d->stats.stat[f][p]);
    stat_reset_peak(&d->stats.oversize_allocations);
    stat_reset_peak(&d->stats.oversize_segments);
    pthread_mutex_unlock(&d->lock);
    return TD_OK;
}

/* ---- snapshot ------------------------------------------------------------------------------- */

static int segment_addr_cmp(const void *a, const void *b)
{
    const td_memory_segment *x = a, *y = b;
    if (x->device.index != y->device.index)
        return x->device.index < y->device.index ? -1 : 1;
    return x->address < y->address ? -1 : x->address > y->address ? 1 : 0;
}

/* Appends the device's segments to out. Under d->lock. */
typedef TD_VEC(td_memory_segment) segment_vec;

static void snapshot_device(const alloc_device *d, segment_vec *out)
{
    for (size_t i = 0; i < d->segments.len; i++) {
        const alloc_segment *seg = d->segments.items[i];
        td_memory_segment ms = {0};
        ms.device.type = d->type;
        ms.device.index = d->index;
        ms.address = seg->base;
        ms.total_size = seg->size;
        ms.stream_id = seg->stream_id;
        ms.is_large = !seg->is_small;
        for (const alloc_block *b = seg->head; b; b = b->next)
            ms.block_count++;
        ms.blocks = TD_NEW_ARRAY(td_memory_block, ms.block_count);
        size_t n = 0;
        for (const alloc_block *b = seg->head; b; b = b->next, n++) {
            td_memory_block *mb = &ms.blocks[n];
            mb->address = b->address;
            mb->size = b->size;
            mb->requested_size = b->requested;
            if (b->allocated)
                mb->state = TD_BLOCK_ACTIVE_ALLOCATED;
            else if (!b->in_pool)
                mb->state = TD_BLOCK_ACTIVE_PENDING_FREE;
            else
                mb->state = TD_BLOCK_INACTIVE;
            if (mb->state == TD_BLOCK_ACTIVE_ALLOCATED)
                ms.allocated_size += b->size;
            if (mb->state != TD_BLOCK_INACTIVE) {
                ms.active_size += b->size;
                ms.requested_size += b->requested;
            }
        }
        TD_VEC_PUSH(out, ms);
    }
}

td_status td_memory_snapshot_get(td_device_type type, td_memory_snapshot *out)
{
    if (!out)
        return error_set(TD_ERR_INVALID, "td_memory_snapshot_get: out must not be NULL");
    memset(out, 0, sizeof *out);
    const device_impl *impl = device_impl_of(type);
    if (!impl) {
        char got[32];
        td_device cpu = {type, -1};
        return error_fmt(TD_ERR_INVALID, "Expected a cuda or sim device type, but got: %s",
                         td_device_str(cpu, got, sizeof got));
    }
    pthread_once(&devices_once, devices_init);
    segment_vec segs = {0};
    for (int i = 0; i < DEVICE_MAX_DEVICES; i++) {
        alloc_device *d = &devices[type][i];
        pthread_mutex_lock(&d->lock);
        if (d->used)
            snapshot_device(d, &segs);
        pthread_mutex_unlock(&d->lock);
    }
    if (segs.len > 1)
        qsort(segs.items, segs.len, sizeof segs.items[0], segment_addr_cmp);
    out->segment_count = segs.len;
    out->segments = segs.items;
    return TD_OK;
}

void td_memory_snapshot_free(td_memory_snapshot *snapshot)
{
    if (!snapshot)
        return;
    for (size_t i = 0; i < snapshot->segment_count; i++)
        free(snapshot->segments[i].blocks);
    free(snapshot->segments);
    snapshot->segments = NULL;
    snapshot->segment_count = 0;
}

/* ---- interprocess sharing ------------------------------------------------------------------- */

td_status device_allocator_segment_of(const void *ptr, td_device *device, void **base, size_t *size)
{
    uintptr_t key = (uintptr_t)ptr;
    pthread_mutex_lock(&pointers_lock);
    alloc_block *b = map_get(&pointers, &key, sizeof key);
    if (b) {
        const alloc_segment *seg = b->segment;
        device->type = seg->device->type;
        device->index = seg->device->index;
        *base = (void *)seg->base;
        *size = seg->size;
    }
    pthread_mutex_unlock(&pointers_lock);
    if (!b)
        return error_fmt(TD_ERR_INVALID, "%p is not a live allocation of the caching allocator", ptr);
    return TD_OK;
}
