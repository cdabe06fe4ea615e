/* The caching pinned host allocator (PyTorch's CachingHostAllocator): page-locked host memory for
 * asynchronous copies, cached by size.
 *
 * Requests round up to a power of two and take the smallest cached free block that holds them,
 * else a new block from the implementation's host_malloc (cuda's when a CUDA device exists, else
 * sim's plain host memory). A copy that reads or writes a block on some stream records a native
 * event on that stream and its device (td_host_record_stream); a freed block goes back to the free
 * set only once all its events have completed, so work still queued on a slow stream of any device
 * never sees the block handed out again (spec 6). Pending blocks are polled (never waited for) at
 * each alloc, free and empty_cache; only shutdown waits, with no lock held.
 *
 * One mutex guards the cache; it is never held across a blocking wait or across host_malloc /
 * host_free. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "base/vec.h"
#include "device/device_impl.h"

typedef struct host_event {
    const device_impl *impl;
    int index;
    void *native;
} host_event;

typedef struct host_block {
    void *ptr;
    size_t size; /* a power of two */
    const device_impl *impl;
    bool allocated;
    TD_VEC(host_event) events; /* recorded by copies; polled until done */
} host_block;

typedef TD_VEC(host_block *) host_block_vec;

static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;
static host_block_vec blocks_by_address; /* every block the cache owns, sorted by ptr */
static host_block_vec free_blocks;       /* free and reusable, sorted by (size, ptr) */
static host_block_vec pending_blocks;    /* freed, waiting for events */
static int64_t live_blocks;

/* ---- sorted sets ---------------------------------------------------------------------------- */

/* The number of blocks whose ptr is <= p. */
static size_t address_upper(uintptr_t p)
{
    size_t lo = 0, hi = blocks_by_address.len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)blocks_by_address.items[mid]->ptr <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The block whose range holds p, or NULL. Under host_lock. */
static host_block *block_containing(const void *p)
{
    size_t at = address_upper((uintptr_t)p);
    if (at == 0)
        return NULL;
    host_block *b = blocks_by_address.items[at - 1];
    return (uintptr_t)p < (uintptr_t)b->ptr + b->size ? b : NULL;
}

static void vec_insert_at(host_block_vec *v, size_t at, host_block *b)
{
    TD_VEC_RESERVE(v, v->len + 1);
    memmove(&v->items[at + 1], &v->items[at], (v->len - at) * sizeof(v->items[0]));
    v->items[at] = b;
    v->len++;
}

static void vec_remove_at(host_block_vec *v, size_t at)
{
    memmove(&v->items[at], &v->items[at + 1], (v->len - at - 1) * sizeof(v->items[0]));
    v->len--;
}

static bool free_less(const host_block *a, size_t size, uintptr_t ptr)
{
    return a->size < size || (a->size == size && (uintptr_t)a->ptr < ptr);
}

static size_t free_lower_bound(size_t size, uintptr_t ptr)
{
    size_t lo = 0, hi = free_blocks.len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (free_less(free_blocks.items[mid], size, ptr))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void free_insert(host_block *b)
{
    vec_insert_at(&free_blocks, free_lower_bound(b->size, (uintptr_t)b->ptr), b);
}

/* ---- events --------------------------------------------------------------------------------- */

/* Destroys the block's completed events; true when none is left. Never waits. Under host_lock. */
static bool events_poll(host_block *b)
{
    for (size_t i = 0; i < b->events.len;) {
        host_event *ev = &b->events.items[i];
        if (ev->impl->event_query(ev->index, ev->native) != 0) { /* done (or failed: nothing to wait for) */
            ev->impl->event_destroy(ev->index, ev->native);
            TD_VEC_SWAP_REMOVE(&b->events, i);
        } else {
            i++;
        }
    }
    return b->events.len == 0;
}

/* Pending blocks whose events are all done become reusable. Under host_lock. */
static void pending_poll(void)
{
    for (size_t i = 0; i < pending_blocks.len;) {
        host_block *b = pending_blocks.items[i];
        if (events_poll(b)) {
            TD_VEC_SWAP_REMOVE(&pending_blocks, i);
            free_insert(b);
        } else {
            i++;
        }
    }
}

/* ---- public --------------------------------------------------------------------------------- */

static size_t power_of_two_ceil(size_t n)
{
    size_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

td_status td_host_alloc(size_t nbytes, void **out)
{
    if (!out)
        return error_set(TD_ERR_INVALID, "td_host_alloc: out must not be NULL");
    *out = NULL;
    if (nbytes == 0)
        return TD_OK;
    if (nbytes > SIZE_MAX / 2 + 1)
        return error_fmt(TD_ERR_NOMEM, "td_host_alloc: cannot allocate %zu bytes of pinned memory", nbytes);
    size_t size = power_of_two_ceil(nbytes);

    pthread_mutex_lock(&host_lock);
    pending_poll();
    size_t at = free_lower_bound(size, 0);
    host_block *b = at < free_blocks.len ? free_blocks.items[at] : NULL;
    if (b) {
        vec_remove_at(&free_blocks, at);
        b->allocated = true;
        live_blocks++;
    }
    pthread_mutex_unlock(&host_lock);
    if (b) {
        *out = b->ptr;
        return TD_OK;
    }

    const device_impl *impl = device_impl_of(td_device_count(TD_DEVICE_CUDA) > 0 ? TD_DEVICE_CUDA : TD_DEVICE_SIM);
    void *ptr = NULL;
    TD_TRY(impl->host_malloc(size, &ptr));
    b = TD_NEW(host_block);
    b->ptr = ptr;
    b->size = size;
    b->impl = impl;
    b->allocated = true;
    pthread_mutex_lock(&host_lock);
    vec_insert_at(&blocks_by_address, address_upper((uintptr_t)ptr), b);
    live_blocks++;
    pthread_mutex_unlock(&host_lock);
    *out = ptr;
    return TD_OK;
}

void td_host_free(void *ptr)
{
    if (!ptr)
        return;
    pthread_mutex_lock(&host_lock);
    host_block *b = block_containing(ptr);
    if (!b || b->ptr != ptr || !b->allocated) {
        pthread_mutex_unlock(&host_lock);
        TD_LOG_ERROR("td_host_free: %p is not a pinned block from td_host_alloc (or was freed already)", ptr);
        return;
    }
    b->allocated = false;
    live_blocks--;
    if (events_poll(b))
        free_insert(b);
    else
        TD_VEC_PUSH(&pending_blocks, b);
    pthread_mutex_unlock(&host_lock);
}

td_status td_host_record_stream(void *ptr, td_stream *s)
{
    if (!s)
        return error_set(TD_ERR_INVALID, "td_host_record_stream: the stream must not be NULL");
    const device_impl *impl = device_impl_of(s->device.type);
    if (!impl)
        return error_set(TD_ERR_INVALID, "td_host_record_stream: the stream is not on an accelerator");
    td_status st = TD_OK;
    pthread_mutex_lock(&host_lock);
    host_block *b = ptr ? block_containing(ptr) : NULL;
    if (!b || !b->allocated) {
        pthread_mutex_unlock(&host_lock);
        return error_fmt(TD_ERR_INVALID, "td_host_record_stream: %p is not in a pinned block from td_host_alloc", ptr);
    }
    /* Recording does not wait: the event marks the work queued on s so far, on s's own device. */
    host_event ev = {impl, s->device.index, NULL};
    st = impl->event_create(ev.index, TD_EVENT_DEFAULT, &ev.native);
    if (st == TD_OK) {
        st = impl->event_record(ev.index, ev.native, s->native);
        if (st == TD_OK)
            TD_VEC_PUSH(&b->events, ev);
        else
            impl->event_destroy(ev.index, ev.native);
    }
    pthread_mutex_unlock(&host_lock);
    return st;
}

bool td_host_is_pinned(const void *ptr)
{
    if (!ptr)
        return false;
    pthread_mutex_lock(&host_lock);
    host_block *b = block_containing(ptr);
    bool pinned = b && b->allocated;
    pthread_mutex_unlock(&host_lock);
    return pinned;
}

/* Takes every free block out of the cache into out. Under host_lock. */
static void take_free_blocks(host_block_vec *out)
{
    for (size_t i = 0; i < free_blocks.len; i++) {
        host_block *b = free_blocks.items[i];
        size_t at = address_upper((uintptr_t)b->ptr);
        vec_remove_at(&blocks_by_address, at - 1);
        TD_VEC_PUSH(out, b);
    }
    free_blocks.len = 0;
}

static void release_blocks(host_block_vec *list)
{
    for (size_t i = 0; i < list->len; i++) {
        host_block *b = list->items[i];
        b->impl->host_free(b->ptr);
        TD_VEC_FREE(&b->events);
        free(b);
    }
    TD_VEC_FREE(list);
}

td_status td_host_empty_cache(void)
{
    host_block_vec list = {0};
    pthread_mutex_lock(&host_lock);
    pending_poll();
    take_free_blocks(&list);
    pthread_mutex_unlock(&host_lock);
    release_blocks(&list);
    return TD_OK;
}

int64_t device_host_release_all(void)
{
    /* Wait for the pending blocks' events without the lock: the blocks leave the pending list
     * first, so no other thread polls (and destroys) those events meanwhile. */
    pthread_mutex_lock(&host_lock);
    host_block_vec waiting = pending_blocks;
    memset(&pending_blocks, 0, sizeof pending_blocks);
    pthread_mutex_unlock(&host_lock);
    for (size_t i = 0; i < waiting.len; i++) {
        host_block *b = waiting.items[i];
        for (size_t e = 0; e < b->events.len; e++)
            (void)b->events.items[e].impl->event_synchronize(b->events.items[e].index, b->events.items[e].native);
    }
    host_block_vec list = {0};
    pthread_mutex_lock(&host_lock);
    for (size_t i = 0; i < waiting.len; i++) {
        host_block *b = waiting.items[i];
        for (size_t e = 0; e < b->events.len; e++)
            b->events.items[e].impl->event_destroy(b->events.items[e].index, b->events.items[e].native);
        b->events.len = 0;
        free_insert(b);
    }
    take_free_blocks(&list);
    int64_t still = live_blocks;
    pthread_mutex_unlock(&host_lock);
    TD_VEC_FREE(&waiting);
    release_blocks(&list);
    return still;
}

int64_t device_host_live_blocks(void)
{
    pthread_mutex_lock(&host_lock);
    int64_t n = live_blocks;
    pthread_mutex_unlock(&host_lock);
    return n;
}
