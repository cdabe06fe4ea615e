/* Storages: refcounted memory that tensors view, with weak references and in-place data swaps.
 *
 * The heap allocator gives 64-byte aligned blocks (cache lines, and the widest vector loads the
 * reduce kernels use); td_storage_wrap adopts memory the user owns. Later layers add their own
 * allocators (shared memory, device memory) through storage.h and may move a live storage to
 * their memory with storage_swap_data. */
#include "tensor/storage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/hugealloc.h"
#include "base/error.h"

static void heap_free(void *data, size_t nbytes, void *ctx)
{
    (void)ctx;
    huge_free(data, nbytes ? nbytes : 64);
}

const td_storage_allocator storage_heap_allocator = {
    .kind = TD_STORAGE_HEAP,
    .name = "heap",
    .free = heap_free,
};

typedef struct external_ctx {
    void (*free_fn)(void *ctx);
    void *ctx;
} external_ctx;

static void external_free(void *data, size_t nbytes, void *ctx)
{
    external_ctx *e = ctx;
    if (e->free_fn)
        e->free_fn(e->ctx);
    free(e);
}

static const td_storage_allocator external_allocator = {
    .kind = TD_STORAGE_EXTERNAL,
    .name = "external",
    .free = external_free,
};

static const td_device cpu_device = {.type = TD_DEVICE_CPU, .index = -1};

td_storage *storage_new_with(void *data, size_t nbytes, td_device device, const td_storage_allocator *allocator,
                                void *allocator_ctx, bool resizable)
{
    td_storage *s = TD_NEW(td_storage);
    ref_init(&s->refcount);
    ref_init(&s->weakcount);
    s->data = data;
    s->nbytes = nbytes;
    s->device = device;
    s->allocator = allocator;
    s->allocator_ctx = allocator_ctx;
    s->resizable = resizable;
    atomic_init(&s->version, 0);
    return s;
}

static void describe_size(char *out, size_t len, size_t nbytes)
{
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)nbytes;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(out, len, "a tensor storage of %zu bytes", nbytes);
    else
        snprintf(out, len, "a tensor storage of %.2f %s", v, units[u]);
}

static td_status heap_alloc(size_t nbytes, bool zero, td_storage **out)
{
    void *data = NULL;
    /* A zero-byte storage still gets a real block, so element pointers are never NULL-based. Large
     * storages go on transparent huge pages: copies between ranks and the reduce loops then walk
     * one page-table entry per 2 MiB, and freed ones are kept for reuse (base/hugealloc.h). The
     * size is described only on failure: formatting it costs more than a small allocation. */
    td_status st = huge_try_alloc(nbytes ? nbytes : 64, "a tensor storage", &data);
    if (st != TD_OK && st != TD_ERR_NOMEM)
        return st; /* a bad TDIST_STORAGE_CACHE */
    if (st != TD_OK) {
        char what[64];
        describe_size(what, sizeof what, nbytes);
        return error_fmt(TD_ERR_NOMEM, "out of memory allocating %s (%zu bytes)", what, nbytes ? nbytes : 64);
    }
    if (zero)
        memset(data, 0, nbytes);
    *out = storage_new_with(data, nbytes, cpu_device, &storage_heap_allocator, NULL, true);
    return TD_OK;
}

td_status td_storage_new(size_t nbytes, td_storage **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_storage_new: out is NULL");
    return heap_alloc(nbytes, true, out);
}

td_status storage_new_uninit(size_t nbytes, td_storage **out) { return heap_alloc(nbytes, false, out); }

td_status td_storage_wrap(void *data, size_t nbytes, void (*free_fn)(void *ctx), void *ctx, td_storage **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_storage_wrap: out is NULL");
    if (!data && nbytes > 0)
        return error_fmt(TD_ERR_INVALID, "td_storage_wrap: data is NULL but nbytes is %zu", nbytes);
    external_ctx *e = TD_NEW(external_ctx);
    e->free_fn = free_fn;
    e->ctx = ctx;
    *out = storage_new_with(data, nbytes, cpu_device, &external_allocator, e, false);
    return TD_OK;
}

td_storage *td_storage_retain(td_storage *s)
{
    if (s)
        ref_inc(&s->refcount);
    return s;
}

void td_storage_release(td_storage *s)
{
    if (!s || !ref_dec(&s->refcount))
        return;
    if (s->allocator && s->allocator->free)
        s->allocator->free(s->data, s->nbytes, s->allocator_ctx);
    s->data = NULL;
    s->allocator_ctx = NULL;
    storage_weak_release(s); /* the strong references' collective weak one */
}

td_storage *storage_weak_retain(td_storage *s)
{
    if (s)
        ref_inc(&s->weakcount);
    return s;
}

void storage_weak_release(td_storage *s)
{
    if (s && ref_dec(&s->weakcount))
        free(s);
}

td_storage *storage_weak_lock(td_storage *s)
{
    return s && ref_inc_not_zero(&s->refcount) ? s : NULL;
}

long storage_use_count(const td_storage *s) { return s ? ref_count((td_ref *)&s->refcount) : 0; }

void *td_storage_data(const td_storage *s) { return s ? s->data : NULL; }
size_t td_storage_nbytes(const td_storage *s) { return s ? s->nbytes : 0; }
td_device td_storage_device(const td_storage *s) { return s ? s->device : cpu_device; }
td_storage_kind storage_kind_of(const td_storage *s) { return s->allocator->kind; }

bool td_storage_is_shared(const td_storage *s)
{
    if (!s)
        return false;
    switch (s->allocator->kind) {
    case TD_STORAGE_SHM_FD:
    case TD_STORAGE_SHM_NAMED:
    case TD_STORAGE_DEVICE: /* as torch: a CUDA storage counts as shared */
    case TD_STORAGE_CUDA_IPC:
        return true;
    default:
        return s->device.type == TD_DEVICE_CUDA;
    }
}

void storage_swap_data(td_storage *s, void *data, size_t nbytes, const td_storage_allocator *allocator,
                          void *allocator_ctx, bool resizable)
{
    void *old = s->data;
    size_t old_nbytes = s->nbytes;
    const td_storage_allocator *old_alloc = s->allocator;
    void *old_ctx = s->allocator_ctx;
    s->data = data;
    s->nbytes = nbytes;
    s->allocator = allocator;
    s->allocator_ctx = allocator_ctx;
    s->resizable = resizable;
    if (old_alloc && old_alloc->free)
        old_alloc->free(old, old_nbytes, old_ctx);
}
