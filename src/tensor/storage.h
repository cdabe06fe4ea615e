/* Internal: the storage object, its allocators and weak references.
 *
 * A storage is refcounted memory that tensors view. Its memory comes from an allocator, named by a
 * small vtable with a kind tag (heap, memory the user wrapped, and the kinds later layers add:
 * shared memory from the mp layer, device memory from the device layer). A later layer may move a
 * live storage to other memory with storage_swap_data(): tensors never cache the data pointer,
 * they read storage->data at each access, so every existing view sees the move.
 *
 * Weak references (for caches that must not keep storages alive, like the mp layer's handle ->
 * storage table) work as std::weak_ptr: `weakcount` counts the weak references plus one for all
 * the strong ones together. The data is freed when the last strong reference goes, the struct when
 * the last weak one does, so a weak holder can always call storage_weak_lock() safely. */
#ifndef TDIST_TENSOR_STORAGE_H
#define TDIST_TENSOR_STORAGE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/tensor.h>

#include "base/ref.h"

typedef enum td_storage_kind {
    TD_STORAGE_HEAP = 0,   /* td_storage_new: 64-byte aligned heap block, free() */
    TD_STORAGE_EXTERNAL,   /* td_storage_wrap: the user's memory and free callback */
    TD_STORAGE_SHM_FD,     /* mp: shared memory passed by file descriptor */
    TD_STORAGE_SHM_NAMED,  /* mp: named shared memory (file_system strategy) */
    /* device: memory of an accelerator (cuda or sim) from the caching allocator, td_device_malloc;
     * storage->device says which (it was TD_STORAGE_CUDA before sim devices existed). */
    TD_STORAGE_DEVICE,
    TD_STORAGE_CUDA_IPC,   /* device: CUDA memory opened from another process's IPC handle */
    TD_STORAGE_PINNED,     /* device: page-locked host memory from td_host_alloc (a CPU storage) */
} td_storage_kind;

typedef struct td_storage_allocator {
    td_storage_kind kind;
    const char *name; /* for messages and logs: "heap", "shm fd" */
    /* Releases memory this allocator provided; ctx is the storage's allocator_ctx. May be NULL
     * when there is nothing to release. Runs once, when the last strong reference goes (or when
     * storage_swap_data replaces the memory). */
    void (*free)(void *data, size_t nbytes, void *ctx);
} td_storage_allocator;

struct td_storage {
    td_ref refcount;  /* strong references: the data lives while > 0 */
    td_ref weakcount; /* weak references + 1 while any strong one exists: the struct lives while > 0 */
    void *data;       /* NULL only for some zero-byte storages */
    size_t nbytes;
    td_device device;
    const td_storage_allocator *allocator;
    void *allocator_ctx;
    bool resizable;
    /* The in-place version counter (td_tensor_version): every view of the storage shares it, as
     * views share PyTorch's version counter; bumped once by each in-place write. */
    atomic_uint_fast64_t version;
};

static inline void storage_bump_version(td_storage *s) { atomic_fetch_add(&s->version, 1); }

extern const td_storage_allocator storage_heap_allocator;

/* A storage over memory an allocator provided; takes ownership of data (allocator->free runs when
 * the last reference goes). Never fails. */
td_storage *storage_new_with(void *data, size_t nbytes, td_device device, const td_storage_allocator *allocator,
                                void *allocator_ctx, bool resizable);
/* A heap storage whose bytes are not initialized (td_tensor_empty). */
td_status storage_new_uninit(size_t nbytes, td_storage **out);
td_storage_kind storage_kind_of(const td_storage *s);

/* Replaces the storage's memory in place: every tensor on the storage sees the new data from now
 * on. The old memory is released with the old allocator. The caller copies the bytes first and
 * makes sure no other thread is using the old memory at the same time (as in PyTorch's
 * share_memory_). */
void storage_swap_data(td_storage *s, void *data, size_t nbytes, const td_storage_allocator *allocator,
                          void *allocator_ctx, bool resizable);

/* Weak references. */
td_storage *storage_weak_retain(td_storage *s);
void storage_weak_release(td_storage *s);
/* A new strong reference, or NULL when the storage's last strong reference is already gone. */
td_storage *storage_weak_lock(td_storage *s);
/* Strong references now (racy by nature: for tests and cache purging). */
long storage_use_count(const td_storage *s);

#endif
