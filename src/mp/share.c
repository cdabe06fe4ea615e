/* Shared storages: the sharing strategies, td_storage_share_memory (moving a storage into shared
 * memory in place), the two shared-memory allocators, and the per-process identity cache.
 *
 * file_descriptor: the storage lives in an unlinked segment whose fd it keeps; sending passes the
 * fd. file_system: a named segment with a refcount header (shm_manager.h); sending passes the name
 * and an in-flight reference. Either way a process that receives a segment it already maps gets
 * its existing td_storage back: the cache maps "fd:<dev>:<ino>" or "fs:<name>" to a weak
 * reference, and each allocator's free removes its entry, so the cache holds exactly the live
 * shared storages. The cache lock is never held while a storage is released (a release may run
 * the free that takes it) and is re-created in a forked child.
 *
 * A storage inherited through fork keeps working in the child (same mapping), but the child owns
 * none of its references: the allocators only unmap there, and leave refcounts and the daemon to
 * the process that took them. */
#include "mp/share.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/map.h"
#include "mp/shm_manager.h"
#include "tensor/storage.h"

/* ---- strategies --------------------------------------------------------------------------- */

static const char *const strategy_names[] = {"file_descriptor", "file_system", NULL};
static pthread_once_t strategy_once = PTHREAD_ONCE_INIT;
static _Atomic int strategy;

static void strategy_init(void)
{
    int v = TD_MP_FILE_DESCRIPTOR;
    if (env_get_enum("TDIST_SHARING_STRATEGY", strategy_names, TD_MP_FILE_DESCRIPTOR, &v) != TD_OK) {
        TD_LOG_ERROR("%s; using file_descriptor", td_last_error());
        v = TD_MP_FILE_DESCRIPTOR;
    }
    atomic_store(&strategy, v);
}

td_status td_mp_set_sharing_strategy(td_mp_strategy s)
{
    if ((unsigned)s > TD_MP_FILE_SYSTEM)
        return error_fmt(TD_ERR_INVALID, "unknown sharing strategy %d: the strategies are file_descriptor and "
                                        "file_system",
                        (int)s);
    pthread_once(&strategy_once, strategy_init);
    atomic_store(&strategy, (int)s);
    return TD_OK;
}

td_mp_strategy td_mp_get_sharing_strategy(void)
{
    pthread_once(&strategy_once, strategy_init);
    return (td_mp_strategy)atomic_load(&strategy);
}

unsigned td_mp_all_sharing_strategies(void) { return (1u << TD_MP_FILE_DESCRIPTOR) | (1u << TD_MP_FILE_SYSTEM); }

const char *td_mp_strategy_name(td_mp_strategy s) { return (unsigned)s <= TD_MP_FILE_SYSTEM ? strategy_names[s] : "unknown"; }

td_status td_mp_strategy_from_name(const char *name, td_mp_strategy *out)
{
    for (int i = 0; strategy_names[i]; i++) {
        if (name && strcmp(name, strategy_names[i]) == 0) {
            *out = (td_mp_strategy)i;
            return TD_OK;
        }
    }
    return error_fmt(TD_ERR_INVALID, "unknown sharing strategy '%s': the strategies are file_descriptor and file_system",
                    name ? name : "(null)");
}

/* ---- identity cache ----------------------------------------------------------------------- */

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static td_map cache = TD_MAP_INIT; /* key -> td_storage * (one weak reference each) */

/* Serializes moves into shared memory (two threads sharing one storage must not both move it). */
static pthread_mutex_t share_mu = PTHREAD_MUTEX_INITIALIZER;

static void cache_after_fork(void)
{
    pthread_mutex_init(&cache_mu, NULL);
    pthread_mutex_init(&share_mu, NULL);
}

__attribute__((constructor)) static void cache_register_atfork(void) { pthread_atfork(NULL, NULL, cache_after_fork); }

/* A live storage for key (a new reference), or NULL. */
static td_storage *cache_lookup(const char *key)
{
    pthread_mutex_lock(&cache_mu);
    td_storage *s = map_get_str(&cache, key);
    s = s ? storage_weak_lock(s) : NULL;
    pthread_mutex_unlock(&cache_mu);
    return s;
}

/* Adds s under key unless a live storage is already there; returns that one (a new reference) in
 * that case, else NULL. */
static td_storage *cache_insert(const char *key, td_storage *s)
{
    pthread_mutex_lock(&cache_mu);
    td_storage *old = map_get_str(&cache, key);
    td_storage *live = old ? storage_weak_lock(old) : NULL;
    if (!live) {
        map_put(&cache, key, strlen(key), storage_weak_retain(s));
        if (old)
            storage_weak_release(old); /* its free has not run yet; it will find s and leave it */
    }
    pthread_mutex_unlock(&cache_mu);
    return live;
}

static void cache_remove(const char *key, td_storage *s)
{
    pthread_mutex_lock(&cache_mu);
    if (map_get_str(&cache, key) == s) {
        map_remove(&cache, key, strlen(key));
        storage_weak_release(s); /* not the last weak reference: the strong side still holds one */
    }
    pthread_mutex_unlock(&cache_mu);
}

size_t shm_cache_size(void)
{
    pthread_mutex_lock(&cache_mu);
    size_t n = cache.len;
    pthread_mutex_unlock(&cache_mu);
    return n;
}

/* ---- allocators --------------------------------------------------------------------------- */

typedef struct shm_ctx {
    td_segment seg;
    size_t data_off;    /* 0, or TD_SHM_HEADER_SIZE for named segments */
    pid_t pid;          /* the process whose reference this is */
    uint64_t dev, ino;  /* fd segments */
    td_storage *storage; /* the storage it backs (not a reference), for its cache entry */
    char key[96];
} shm_ctx;

static void shm_fd_free(void *data, size_t nbytes, void *p)
{
    shm_ctx *c = p;
    if (c->storage)
        cache_remove(c->key, c->storage);
    segment_unmap(&c->seg);
    free(c);
}

static void shm_named_free(void *data, size_t nbytes, void *p)
{
    shm_ctx *c = p;
    if (c->storage)
        cache_remove(c->key, c->storage);
    if (c->pid == getpid()) {
        /* Tell the daemon before the decrement: if this process dies in between, the reference
         * leaks until the daemon's final sweep instead of being dropped twice. */
        shmm_notify(TD_SHMM_DROP, c->seg.name);
        if (shm_header_decref((td_shm_header *)c->seg.base)) {
            segment_unlink(c->seg.name);
            shmm_notify(TD_SHMM_FORGET, c->seg.name);
        }
        shmm_release();
    }
    segment_unmap(&c->seg);
    free(c);
}

static const td_storage_allocator shm_fd_allocator = {.kind = TD_STORAGE_SHM_FD, .name = "shm fd", .free = shm_fd_free};
static const td_storage_allocator shm_named_allocator = {
    .kind = TD_STORAGE_SHM_NAMED, .name = "shm named", .free = shm_named_free};

const td_segment *shm_segment_of(const td_storage *s)
{
    if (!s || (s->allocator != &shm_fd_allocator && s->allocator != &shm_named_allocator))
        return NULL;
    return &((shm_ctx *)s->allocator_ctx)->seg;
}

static void fd_key(shm_ctx *c) { snprintf(c->key, sizeof c->key, "fd:%" PRIx64 ":%" PRIx64, c->dev, c->ino); }
static void named_key(shm_ctx *c) { snprintf(c->key, sizeof c->key, "fs:%s", c->seg.name); }

static td_status fd_identity(int fd, uint64_t *dev, uint64_t *ino)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return error_errno(TD_ERR_IO, "fstat of a shared-memory fd");
    *dev = (uint64_t)st.st_dev;
    *ino = (uint64_t)st.st_ino;
    return TD_OK;
}

/* A new file_system segment named `name` for nbytes of data (the caller registered the name). */
static td_status create_named(const char *name, size_t nbytes, shm_ctx *c)
{
    TD_TRY(segment_create_as(name, TD_SHM_HEADER_SIZE + nbytes, false, false, &c->seg));
    td_shm_header *h = c->seg.base;
    h->magic = TD_SHM_HEADER_MAGIC;
    h->nbytes = nbytes;
    atomic_store(&h->refcount, 1);
    c->data_off = TD_SHM_HEADER_SIZE;
    named_key(c);
    return TD_OK;
}

/* Undoes the registration of a name that was not created after all. */
static void unregister_name(const char *name)
{
    shmm_notify(TD_SHMM_DROP, name);
    shmm_notify(TD_SHMM_FORGET, name);
    shmm_release();
}

td_status td_storage_share_memory(td_storage *s)
{
    if (!s)
        return error_fmt(TD_ERR_INVALID, "td_storage_share_memory: storage is NULL");
    if (s->nbytes == 0 || td_storage_is_shared(s))
        return TD_OK;
    if (s->device.type != TD_DEVICE_CPU)
        return error_fmt(TD_ERR_UNSUPPORTED, "share_memory: storages on this device cannot be shared yet");
    bool named = td_mp_get_sharing_strategy() == TD_MP_FILE_SYSTEM;
    const char *sname = td_mp_strategy_name(named ? TD_MP_FILE_SYSTEM : TD_MP_FILE_DESCRIPTOR);
    char name[TD_SEGMENT_NAME_MAX] = "";
    if (named) {
        /* Outside share_mu: this may start the daemon. The name is registered before the segment
         * exists, so a crash right after creating it is still cleaned up. */
        td_status st = shmm_acquire();
        if (st != TD_OK)
            return error_prefix(st, "share_memory of %zu bytes (%s strategy)", s->nbytes, sname);
        segment_make_name(name, "fs");
        shmm_notify(TD_SHMM_HOLD, name);
    }
    pthread_mutex_lock(&share_mu);
    if (td_storage_is_shared(s)) { /* another thread moved it meanwhile */
        pthread_mutex_unlock(&share_mu);
        if (named)
            unregister_name(name);
        return TD_OK;
    }
    shm_ctx *c = TD_NEW(shm_ctx);
    c->seg = (td_segment)TD_SEGMENT_INIT;
    c->pid = getpid();
    td_status st;
    if (named) {
        st = create_named(name, s->nbytes, c);
    } else {
        st = segment_create("fd", s->nbytes, true, true, &c->seg);
        if (st == TD_OK)
            st = fd_identity(c->seg.fd, &c->dev, &c->ino);
        if (st == TD_OK)
            fd_key(c);
        else
            segment_unmap(&c->seg);
    }
    if (st != TD_OK) {
        pthread_mutex_unlock(&share_mu);
        free(c);
        if (named)
            unregister_name(name);
        return error_prefix(st, "share_memory of %zu bytes (%s strategy)", s->nbytes, sname);
    }
    char *data = (char *)c->seg.base + c->data_off;
    memcpy(data, s->data, s->nbytes);
    c->storage = s;
    storage_swap_data(s, data, s->nbytes, named ? &shm_named_allocator : &shm_fd_allocator, c, false);
    td_storage *other = cache_insert(c->key, s);
    pthread_mutex_unlock(&share_mu);
    if (other) /* cannot happen for a segment this process just made; keep the counts right anyway */
        td_storage_release(other);
    return TD_OK;
}

td_status td_tensor_share_memory(td_tensor *t)
{
    if (!t)
        return error_fmt(TD_ERR_INVALID, "td_tensor_share_memory: tensor is NULL");
    return td_storage_share_memory(td_tensor_storage(t));
}

bool td_tensor_is_shared(const td_tensor *t) { return t && td_storage_is_shared(td_tensor_storage(t)); }

/* ---- export / import ---------------------------------------------------------------------- */

td_status shm_export(td_storage *s, td_shm_handle *h)
{
    memset(h, 0, sizeof *h);
    h->fd = -1;
    h->nbytes = s->nbytes;
    if (s->nbytes == 0) {
        h->kind = TD_SHM_EMPTY;
        return TD_OK;
    }
    if (!td_storage_is_shared(s))
        TD_TRY(td_storage_share_memory(s));
    if (s->allocator == &shm_fd_allocator) {
        shm_ctx *c = s->allocator_ctx;
        h->kind = TD_SHM_FD;
        h->fd = c->seg.fd;
        h->dev = c->dev;
        h->ino = c->ino;
        return TD_OK;
    }
    if (s->allocator == &shm_named_allocator) {
        shm_ctx *c = s->allocator_ctx;
        h->kind = TD_SHM_NAMED;
        snprintf(h->name, sizeof h->name, "%s", c->seg.name);
        /* Before the name is published, so the segment outlives the sender if need be. */
        shm_header_incref((td_shm_header *)c->seg.base);
        return TD_OK;
    }
    return error_fmt(TD_ERR_UNSUPPORTED, "a storage in %s memory cannot be sent to another process yet",
                    s->allocator->name);
}

void shm_abandon(const char *name)
{
    char key[96];
    snprintf(key, sizeof key, "fs:%s", name);
    td_storage *s = cache_lookup(key);
    if (s) {
        /* This process holds it too, so the count cannot reach 0 here. */
        shm_header_decref((td_shm_header *)((shm_ctx *)s->allocator_ctx)->seg.base);
        td_storage_release(s);
        return;
    }
    td_segment seg;
    if (segment_open(name, TD_SHM_HEADER_SIZE, &seg) != TD_OK)
        return;
    td_shm_header *h = seg.base;
    if (h->magic == TD_SHM_HEADER_MAGIC && shm_header_decref(h))
        segment_unlink(name);
    segment_unmap(&seg);
}

td_status shm_import_fd(int fd, size_t nbytes, td_storage **out)
{
    uint64_t dev = 0, ino = 0;
    td_status st = fd_identity(fd, &dev, &ino);
    if (st != TD_OK) {
        close(fd);
        return st;
    }
    shm_ctx *c = TD_NEW(shm_ctx);
    c->dev = dev;
    c->ino = ino;
    fd_key(c);
    td_storage *s = cache_lookup(c->key);
    if (s) {
        close(fd);
        free(c);
        *out = s;
        return TD_OK;
    }
    st = nbytes ? segment_map_fd(fd, nbytes, &c->seg) : error_fmt(TD_ERR_INVALID, "an fd handle of 0 bytes");
    if (st != TD_OK) {
        close(fd);
        free(c);
        return st;
    }
    c->pid = getpid();
    s = storage_new_with(c->seg.base, nbytes, (td_device){TD_DEVICE_CPU, -1}, &shm_fd_allocator, c, false);
    c->storage = s;
    td_storage *other = cache_insert(c->key, s);
    if (other) { /* another thread mapped it meanwhile: use that one */
        td_storage_release(s);
        s = other;
    }
    *out = s;
    return TD_OK;
}

td_status shm_import_named(const char *name, size_t nbytes, td_storage **out)
{
    if (!segment_name_valid(name))
        return error_fmt(TD_ERR_INVALID, "'%s' is not a tdist shared-memory segment name", name);
    char key[96];
    snprintf(key, sizeof key, "fs:%s", name);
    td_storage *s = cache_lookup(key);
    if (s) {
        shm_header_decref((td_shm_header *)((shm_ctx *)s->allocator_ctx)->seg.base);
        *out = s;
        return TD_OK;
    }
    shm_ctx *c = TD_NEW(shm_ctx);
    td_status st = segment_open(name, TD_SHM_HEADER_SIZE + nbytes, &c->seg);
    if (st != TD_OK) {
        free(c);
        return st;
    }
    td_shm_header *h = c->seg.base;
    if (h->magic != TD_SHM_HEADER_MAGIC || h->nbytes != nbytes) {
        segment_unmap(&c->seg);
        free(c);
        return error_fmt(TD_ERR_INVALID, "shared memory object </%s> is not a tdist storage of %zu bytes", name, nbytes);
    }
    /* The in-flight reference becomes this process's own; tell the daemon after taking it (a crash
     * in between leaks it until the daemon's final sweep, rather than dropping it twice). */
    st = shmm_acquire();
    if (st != TD_OK) {
        if (shm_header_decref(h))
            segment_unlink(name);
        segment_unmap(&c->seg);
        free(c);
        return st;
    }
    shmm_notify(TD_SHMM_HOLD, name);
    c->pid = getpid();
    c->data_off = TD_SHM_HEADER_SIZE;
    named_key(c);
    s = storage_new_with((char *)c->seg.base + TD_SHM_HEADER_SIZE, nbytes, (td_device){TD_DEVICE_CPU, -1},
                            &shm_named_allocator, c, false);
    c->storage = s;
    td_storage *other = cache_insert(c->key, s);
    if (other) {
        /* Another thread of this process mapped it meanwhile; this mapping's reference was the
         * in-flight one, which the other storage does not need: releasing s drops it. */
        td_storage_release(s);
        s = other;
    }
    *out = s;
    return TD_OK;
}
