/* Device tensors through mp messages (spec/multiprocessing.md section L, torch's CUDA IPC): the
 * producer side exports a device storage, the consumer side rebuilds it over the producer's
 * memory. message.c calls these for every storage whose device is not the CPU.
 *
 * Export: the storage's block lies in a segment of the caching allocator; the message carries the
 * segment's memory handle (device_impl's mem_ipc_handle: cuIpcGetMemHandle, or sim's memfd), the
 * byte offset of the block in it, the storage size, the producer's reference counter for the
 * storage, and the handle of an interprocess event recorded on the producer's current stream. The
 * first export takes the storage over (its allocator becomes "sent device"), with a counter in a
 * small shared page of its own (a memfd that consumers open as /proc/<pid>/fd/<fd>); each export
 * adds one to it for the message in flight. When the producer lets go of the storage while the
 * counter is above 0, the block goes to limbo instead of back to the allocator; td_mp_ipc_collect
 * (and every later export and release) frees limbo blocks whose counters fell to 0.
 *
 * Import: the per-process base cache maps a memory handle to the one mapping this process opened
 * of it (CUDA lets a process open a handle once), and the identity cache maps (handle, offset) to a
 * weak reference of the storage built at base + offset, so a storage sent twice arrives as one
 * (the second message's counter reference is given back at once). The consumer's current stream
 * waits on the producer's event before anything uses the memory. Releasing the storage
 * synchronizes that stream, then decrements the producer's counter (best effort: a producer that
 * is gone is ignored), and closes the mapping with its last storage. A received storage cannot be
 * sent on (torch's message): clone it first. */
#include "mp/device_share.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "base/map.h"
#include "base/vec.h"
#include "device/device_impl.h"
#include "tensor/storage.h"

#define COUNTER_MAGIC 0x43524454u /* "TDRC" */
#define COUNTER_PAGE 4096

typedef struct counter_page {
    _Atomic int64_t count; /* messages in flight + consumer storages */
    uint32_t magic;
} counter_page;

static pthread_mutex_t dshare_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- the producer side ------------------------------------------------------------------------ */

typedef struct sent_ctx {
    void *data;            /* the block (td_device_free'd when done) */
    counter_page *counter;
    int counter_fd;
    uint64_t counter_ino;
    TD_VEC(td_event *) events; /* kept while consumers may still open them */
    struct sent_ctx *next_in_limbo;
} sent_ctx;

static sent_ctx *limbo; /* under dshare_mu */
static size_t limbo_len;

static void sent_destroy(sent_ctx *c)
{
    td_device_free(c->data);
    for (size_t i = 0; i < c->events.len; i++)
        td_event_release(c->events.items[i]);
    TD_VEC_FREE(&c->events);
    munmap(c->counter, COUNTER_PAGE);
    close(c->counter_fd);
    free(c);
}

size_t td_mp_ipc_collect(void)
{
    sent_ctx *done = NULL;
    pthread_mutex_lock(&dshare_mu);
    for (sent_ctx **p = &limbo; *p;) {
        sent_ctx *c = *p;
        if (atomic_load(&c->counter->count) <= 0) {
            *p = c->next_in_limbo;
            c->next_in_limbo = done;
            done = c;
            limbo_len--;
        } else {
            p = &c->next_in_limbo;
        }
    }
    size_t left = limbo_len;
    pthread_mutex_unlock(&dshare_mu);
    while (done) {
        sent_ctx *next = done->next_in_limbo;
        sent_destroy(done);
        done = next;
    }
    return left;
}

static void sent_free(void *data, size_t nbytes, void *p)
{
    (void)data;
    (void)nbytes;
    sent_ctx *c = p;
    if (atomic_load(&c->counter->count) <= 0) {
        sent_destroy(c);
    } else {
        pthread_mutex_lock(&dshare_mu);
        c->next_in_limbo = limbo;
        limbo = c;
        if (++limbo_len == 1001)
            TD_LOG_WARN("Producer process tried to deallocate over 1000 memory blocks referred by consumer processes. "
                        "Deallocation might be significantly slowed down. We assume it will never going to be the "
                        "case, but if it is, please file but to https://github.com/pytorch/pytorch");
        pthread_mutex_unlock(&dshare_mu);
    }
    (void)td_mp_ipc_collect();
}

static const td_storage_allocator sent_allocator = {.kind = TD_STORAGE_DEVICE, .name = "sent device", .free = sent_free};

static td_status counter_create(sent_ctx *c)
{
    int fd = (int)syscall(SYS_memfd_create, "tdist-ipc-refcount", 1u /* MFD_CLOEXEC */);
    if (fd < 0)
        return error_errno(TD_ERR_IO, "sharing a device tensor: memfd_create of its reference counter");
    struct stat st;
    void *p = MAP_FAILED;
    if (ftruncate(fd, COUNTER_PAGE) == 0 && fstat(fd, &st) == 0)
        p = mmap(NULL, COUNTER_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        td_status s = error_errno(TD_ERR_IO, "sharing a device tensor: mapping its reference counter");
        close(fd);
        return s;
    }
    c->counter = p;
    c->counter->magic = COUNTER_MAGIC;
    c->counter_fd = fd;
    c->counter_ino = (uint64_t)st.st_ino;
    return TD_OK;
}

/* The producer's counter page named by (pid, fd, ino), mapped; NULL when it is gone. */
static counter_page *counter_open(int64_t pid, int64_t fd, int64_t ino)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%lld/fd/%lld", (long long)pid, (long long)fd);
    int f = open(path, O_RDWR | O_CLOEXEC);
    if (f < 0)
        return NULL;
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(f, &st) == 0 && (uint64_t)st.st_ino == (uint64_t)ino && st.st_size >= COUNTER_PAGE)
        p = mmap(NULL, COUNTER_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    close(f);
    if (p == MAP_FAILED)
        return NULL;
    if (((counter_page *)p)->magic != COUNTER_MAGIC) {
        munmap(p, COUNTER_PAGE);
        return NULL;
    }
    return p;
}

static void counter_drop(counter_page *c)
{
    if (c) {
        atomic_fetch_sub(&c->count, 1);
        munmap(c, COUNTER_PAGE);
    }
}

static td_value *handle_bytes(const void *bytes, size_t len) { return td_value_bytes(bytes, len); }

td_status dshare_export(td_storage *s, td_value **entry)
{
    *entry = NULL;
    td_device d = s->device;
    if (s->nbytes == 0) { /* nothing to map: rebuilt as a new empty storage on the device */
        *entry = td_value_tuple_of(4, td_value_int(0), td_value_int(0), td_value_int(d.type), td_value_int(d.index));
        return TD_OK;
    }
    if (storage_kind_of(s) == TD_STORAGE_CUDA_IPC)
        return error_set_typed(TD_ERR_UNSUPPORTED, "RuntimeError",
                               "Attempted to send CUDA tensor received from another process; this is not currently "
                               "supported. Consider cloning before sending.");
    if (storage_kind_of(s) != TD_STORAGE_DEVICE)
        return error_fmt(TD_ERR_UNSUPPORTED, "a storage in %s memory on a device cannot be sent to another process",
                         s->allocator->name);
    td_device seg_device;
    void *base = NULL;
    size_t seg_size = 0;
    TD_TRY(device_allocator_segment_of(s->data, &seg_device, &base, &seg_size));
    const device_impl *impl;
    int index;
    TD_TRY(device_check(seg_device, &impl, &index));
    device_mem_ipc_handle mh;
    TD_TRY(impl->mem_ipc_handle(index, base, &mh));

    (void)td_mp_ipc_collect();
    pthread_mutex_lock(&dshare_mu);
    td_status st = TD_OK;
    sent_ctx *c = s->allocator == &sent_allocator ? s->allocator_ctx : NULL;
    if (!c) {
        c = TD_NEW(sent_ctx);
        c->data = s->data;
        st = counter_create(c);
        if (st == TD_OK) {
            /* The storage is ours from now on: its last release decides between freeing and limbo. */
            s->allocator = &sent_allocator;
            s->allocator_ctx = c;
        } else {
            free(c);
            c = NULL;
        }
    }
    if (c)
        atomic_fetch_add(&c->counter->count, 1); /* the message's reference, before it is published */
    pthread_mutex_unlock(&dshare_mu);
    TD_TRY(st);

    /* The consumer's stream waits for the work queued so far on the producer's current stream. */
    td_value *event_value = td_value_none();
    td_stream *stream = NULL;
    td_event *ev = NULL;
    st = td_stream_current(seg_device, &stream);
    if (st == TD_OK)
        st = td_event_create(TD_EVENT_INTERPROCESS | TD_EVENT_BLOCKING, &ev);
    if (st == TD_OK)
        st = td_event_record(ev, stream);
    td_event_ipc_handle eh;
    if (st == TD_OK)
        st = td_event_ipc_handle_get(ev, &eh);
    if (st == TD_OK) {
        td_value_release(event_value);
        event_value = handle_bytes(eh.bytes, sizeof eh.bytes);
        pthread_mutex_lock(&dshare_mu);
        TD_VEC_PUSH(&c->events, ev);
        pthread_mutex_unlock(&dshare_mu);
    } else {
        /* No event: the producer's stream is synchronized instead, as torch past its event budget. */
        td_event_release(ev);
        TD_LOG_DEBUG("sharing a device tensor without an event (%s): synchronizing", td_last_error());
        st = stream ? td_stream_synchronize(stream) : st;
        if (st != TD_OK) {
            atomic_fetch_sub(&c->counter->count, 1);
            td_value_release(event_value);
            return st;
        }
    }
    uintptr_t offset = (uintptr_t)s->data - (uintptr_t)base;
    *entry = td_value_tuple_of(11, td_value_int(3), td_value_int((int64_t)s->nbytes), td_value_int(seg_device.type),
                               td_value_int(seg_device.index), handle_bytes(mh.bytes, sizeof mh.bytes),
                               td_value_int((int64_t)seg_size), td_value_int((int64_t)offset),
                               td_value_int((int64_t)getpid()), td_value_int(c->counter_fd),
                               td_value_int((int64_t)c->counter_ino), event_value);
    return TD_OK;
}

void dshare_abandon(const td_storage *s)
{
    if (s->allocator == &sent_allocator)
        atomic_fetch_sub(&((sent_ctx *)s->allocator_ctx)->counter->count, 1);
}

/* ---- the consumer side ------------------------------------------------------------------------ */

typedef struct opened_base {
    td_device device;
    void *base;
    size_t size;
    long storages; /* under dshare_mu */
    char key[160];
} opened_base;

typedef struct received_ctx {
    opened_base *opened;
    counter_page *counter; /* the producer's, mapped; NULL when it could not be opened */
    td_storage *storage;   /* not a reference: for the identity cache entry */
    char key[192];
} received_ctx;

static td_map bases = TD_MAP_INIT;      /* handle key -> opened_base * */
static td_map identities = TD_MAP_INIT; /* handle key + offset -> td_storage * (weak) */

static void received_free(void *data, size_t nbytes, void *p)
{
    (void)data;
    (void)nbytes;
    received_ctx *c = p;
    /* Nothing queued on this process's stream may still use the memory when the producer may
     * reuse it. */
    td_stream *stream = NULL;
    if (td_stream_current(c->opened->device, &stream) == TD_OK)
        (void)td_stream_synchronize(stream);
    counter_drop(c->counter);
    opened_base *close_it = NULL;
    pthread_mutex_lock(&dshare_mu);
    if (map_get_str(&identities, c->key) == c->storage) {
        map_remove(&identities, c->key, strlen(c->key));
        storage_weak_release(c->storage);
    }
    if (--c->opened->storages == 0) {
        map_remove(&bases, c->opened->key, strlen(c->opened->key));
        close_it = c->opened;
    }
    pthread_mutex_unlock(&dshare_mu);
    if (close_it) {
        const device_impl *impl = device_impl_of(close_it->device.type);
        if (impl)
            impl->mem_close_ipc(close_it->device.index, close_it->base, close_it->size);
        free(close_it);
    }
    free(c);
}

static const td_storage_allocator received_allocator = {
    .kind = TD_STORAGE_CUDA_IPC, .name = "received device", .free = received_free};

static bool get_i(const td_value *t, size_t i, int64_t *out)
{
    const td_value *v = i < td_value_len(t) ? td_value_at(t, i) : NULL;
    if (!v || td_value_kind_of(v) != TD_VAL_INT)
        return false;
    *out = td_value_get_int(v);
    return true;
}

static td_status bad_entry(const char *what) { return error_fmt(TD_ERR_INVALID, "invalid mp message: %s", what); }

td_status dshare_import_empty(const td_value *e, td_storage **out)
{
    int64_t type, index;
    if (!get_i(e, 2, &type) || !get_i(e, 3, &index) || (type != TD_DEVICE_CUDA && type != TD_DEVICE_SIM) || index < 0 ||
        index > INT32_MAX)
        return bad_entry("an empty device storage entry is not (0, 0, device type, index)");
    td_device d = {(td_device_type)type, (int)index};
    td_tensor *t = NULL;
    TD_TRY(td_tensor_empty_on(d, TD_UINT8, TD_SHAPE(0), NULL, &t));
    *out = td_storage_retain(td_tensor_storage(t));
    td_tensor_release(t);
    return TD_OK;
}

td_status dshare_import(const td_value *e, td_storage **out)
{
    int64_t nbytes, type, index, seg_size, offset, pid, counter_fd, counter_ino;
    const td_value *mhv = td_value_len(e) == 11 ? td_value_at(e, 4) : NULL;
    const td_value *ehv = td_value_len(e) == 11 ? td_value_at(e, 10) : NULL;
    size_t mh_len = 0, eh_len = 0;
    const void *mh_bytes = mhv && td_value_kind_of(mhv) == TD_VAL_BYTES ? td_value_get_bytes(mhv, &mh_len) : NULL;
    const void *eh_bytes = ehv && td_value_kind_of(ehv) == TD_VAL_BYTES ? td_value_get_bytes(ehv, &eh_len) : NULL;
    if (!get_i(e, 1, &nbytes) || !get_i(e, 2, &type) || !get_i(e, 3, &index) || !get_i(e, 5, &seg_size) ||
        !get_i(e, 6, &offset) || !get_i(e, 7, &pid) || !get_i(e, 8, &counter_fd) || !get_i(e, 9, &counter_ino) ||
        !mh_bytes || mh_len != sizeof(device_mem_ipc_handle) ||
        (td_value_kind_of(ehv) != TD_VAL_NONE && (!eh_bytes || eh_len != sizeof(td_event_ipc_handle))))
        return bad_entry("a device storage entry is not (3, nbytes, type, index, handle, segment size, offset, pid, "
                         "counter fd, counter inode, event handle)");
    if ((type != TD_DEVICE_CUDA && type != TD_DEVICE_SIM) || index < 0 || index > INT32_MAX || nbytes <= 0 ||
        seg_size <= 0 || offset < 0 || offset > seg_size || nbytes > seg_size - offset)
        return bad_entry("a device storage entry has a bad device, size or offset");
    td_device d = {(td_device_type)type, (int)index};
    const device_impl *impl;
    TD_TRY(device_check(d, &impl, &d.index));

    /* Keys: the memory handle, and the handle with the offset. */
    char hkey[160], ikey[192];
    int at = snprintf(hkey, sizeof hkey, "%d:%d:", (int)d.type, d.index);
    for (size_t i = 0; i < mh_len && at + 2 < (int)sizeof hkey; i++)
        at += snprintf(hkey + at, sizeof hkey - (size_t)at, "%02x", ((const unsigned char *)mh_bytes)[i]);
    snprintf(ikey, sizeof ikey, "%s@%" PRId64, hkey, offset);

    pthread_mutex_lock(&dshare_mu);
    td_storage *known = map_get_str(&identities, ikey);
    known = known ? storage_weak_lock(known) : NULL;
    pthread_mutex_unlock(&dshare_mu);
    if (known) {
        /* This process holds the storage already, and with it a counter reference: give back the
         * message's. */
        counter_drop(counter_open(pid, counter_fd, counter_ino));
        *out = known;
        return TD_OK;
    }

    /* The producer's work on the memory comes first. */
    if (eh_bytes) {
        td_event_ipc_handle eh;
        memcpy(eh.bytes, eh_bytes, sizeof eh.bytes);
        td_event *ev = NULL;
        td_stream *stream = NULL;
        td_status st = td_event_from_ipc_handle(d, &eh, &ev);
        if (st == TD_OK)
            st = td_stream_current(d, &stream);
        if (st == TD_OK)
            st = td_stream_wait_event(stream, ev);
        td_event_release(ev);
        if (st != TD_OK)
            return error_prefix(st, "receiving a device tensor: waiting for the producer's event");
    }

    pthread_mutex_lock(&dshare_mu);
    opened_base *ob = map_get_str(&bases, hkey);
    if (ob)
        ob->storages++;
    pthread_mutex_unlock(&dshare_mu);
    if (!ob) {
        device_mem_ipc_handle mh;
        memcpy(mh.bytes, mh_bytes, sizeof mh.bytes);
        void *base = NULL;
        TD_TRY(impl->mem_open_ipc(d.index, &mh, (size_t)seg_size, &base));
        opened_base *fresh = TD_NEW(opened_base);
        fresh->device = d;
        fresh->base = base;
        fresh->size = (size_t)seg_size;
        fresh->storages = 1;
        snprintf(fresh->key, sizeof fresh->key, "%s", hkey);
        pthread_mutex_lock(&dshare_mu);
        ob = map_get_str(&bases, hkey);
        if (ob) {
            ob->storages++; /* another thread opened it meanwhile */
        } else {
            map_put(&bases, hkey, strlen(hkey), fresh);
            ob = fresh;
            fresh = NULL;
        }
        pthread_mutex_unlock(&dshare_mu);
        if (fresh) {
            impl->mem_close_ipc(d.index, fresh->base, fresh->size);
            free(fresh);
        }
    }
    received_ctx *c = TD_NEW(received_ctx);
    c->opened = ob;
    c->counter = counter_open(pid, counter_fd, counter_ino);
    snprintf(c->key, sizeof c->key, "%s", ikey);
    td_storage *s = storage_new_with((char *)ob->base + offset, (size_t)nbytes, d, &received_allocator, c, false);
    c->storage = s;
    pthread_mutex_lock(&dshare_mu);
    td_storage *old = map_get_str(&identities, ikey);
    td_storage *live = old ? storage_weak_lock(old) : NULL;
    if (!live) {
        map_put(&identities, ikey, strlen(ikey), storage_weak_retain(s));
        if (old)
            storage_weak_release(old);
    }
    pthread_mutex_unlock(&dshare_mu);
    if (live) { /* another thread rebuilt it meanwhile: this one's reference goes back with s */
        td_storage_release(s);
        s = live;
    }
    *out = s;
    return TD_OK;
}
