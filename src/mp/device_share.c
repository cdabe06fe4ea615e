/* Device tensors through mp messages (spec/multiprocessing.md section L, torch's CUDA IPC): the
 * producer side exports a device storage, the consumer side rebuilds it over the producer's
 * memory. message.c calls these for every storage whose device is not the CPU.
 *
 * Export: the storage's block lies in a segment of the caching allocator; the message carries the
 * segment's memory handle (device_impl's mem_ipc_handle: cuIpcGetMemHandle, or sim's memfd), the
 * byte offset of the block in it, the storage size, where the producer's reference counter for the
 * storage lives, and the handle of an interprocess event recorded on the producer's current stream.
 * The first export takes the storage over (its allocator becomes "sent device") and gives it a
 * slot in the current reference-counter file, as torch's CudaIPCRefCountersFile: a memfd of 10 000
 * int64 slots after a 64-byte header, which consumers open as /proc/<pid>/fd/<fd>; a new file is
 * made when the current one has handed out all its slots, slots are never reused, and a file is
 * closed when its last slot is given back (a full file) or by td_mp_ipc_collect (the current file
 * with no slot in use). Each export adds one to the storage's slot for the message in flight.
 * Interprocess events are budgeted as torch's: at most 1000 outstanding per producer (held until
 * no consumer can still open them); past that the export synchronizes the producer's stream and
 * the message says so (no event, event_sync_required false). When the producer lets go of the
 * storage while its slot is above 0, the block goes to limbo instead of back to the allocator;
 * td_mp_ipc_collect (and every later export and release) frees limbo blocks whose slots fell to 0.
 *
 * Import: the per-process base cache maps a memory handle to the one mapping this process opened
 * of it (CUDA lets a process open a handle once), and the identity cache maps (handle, offset) to a
 * weak reference of the storage built at base + offset, so a storage sent twice arrives as one
 * (the second message's counter reference is given back at once). Exports enter the identity
 * cache too: a message a process receives from itself gives back the storage it sent, as torch's
 * shared_cache (CUDA cannot open a handle in the process that made it). The consumer's current stream
 * waits on the producer's event before anything uses the memory. The producer's counter files are
 * mapped once per process while a storage of this process holds a slot in them (best effort: a
 * producer that is gone leaves its slots alone). Releasing the storage synchronizes that stream,
 * then decrements the slot, and closes the mapping with its last storage. A received storage cannot
 * be sent on (torch's message): clone it first. */
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
#define COUNTER_VERSION 1u
#define COUNTER_HEADER 64 /* keeps the slots 64-byte aligned */
#define COUNTER_FILE_BYTES (COUNTER_HEADER + (size_t)DSHARE_COUNTER_SLOTS * sizeof(int64_t))
#define LIMBO_WARN_AT 1000

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_LONG_LOCK_FREE == 2,
               "the reference counters in shared memory need lock-free 64-bit atomics");

typedef struct counter_header {
    uint32_t magic;
    uint32_t version;
    uint32_t slots;
} counter_header;

static _Atomic int64_t *slot_at(void *map, int64_t slot)
{
    return (_Atomic int64_t *)((char *)map + COUNTER_HEADER) + slot;
}

static pthread_mutex_t dshare_mu = PTHREAD_MUTEX_INITIALIZER;

/* The identity cache, under dshare_mu: (memory handle, offset) -> the storage this process holds
 * there (a weak reference), the storages it received and the ones it sent. A message this
 * process sent to itself arrives as the storage it sent, as torch's shared_cache does (CUDA
 * cannot open a handle in the process that made it). */
static td_map identities = TD_MAP_INIT;

/* hkey names a segment (device and memory handle), ikey a storage in it (hkey and offset). */
static void identity_keys(td_device d, const void *mem_handle, int64_t offset, char hkey[160], char ikey[192])
{
    static const char hex[] = "0123456789abcdef";
    int at = snprintf(hkey, 160, "%d:%d:", (int)d.type, d.index);
    const unsigned char *h = mem_handle;
    for (size_t i = 0; i < sizeof(device_mem_ipc_handle) && at + 2 < 160; i++) {
        hkey[at++] = hex[h[i] >> 4];
        hkey[at++] = hex[h[i] & 15];
    }
    hkey[at] = '\0';
    snprintf(ikey, 192, "%s@%" PRId64, hkey, offset);
}

/* Drops s's entry under key, if the entry is s's. Called with dshare_mu held. */
static void identity_forget(const char *key, td_storage *s)
{
    if (key[0] && map_get_str(&identities, key) == s) {
        map_remove(&identities, key, strlen(key));
        storage_weak_release(s);
    }
}

/* ---- the producer's reference-counter files --------------------------------------------------- */

typedef struct counter_file {
    int fd;
    uint64_t ino;
    void *map;
    int64_t handed_out; /* slots given so far; slots are never reused */
    int64_t in_use;     /* slots whose storages are not destroyed yet: the mapping's references */
    struct counter_file *next;
} counter_file;

static counter_file *counter_files;   /* every open file, under dshare_mu */
static counter_file *counter_current; /* where the next slot comes from; NULL: make one */
static size_t counter_files_open, counter_files_made;
static size_t events_outstanding; /* interprocess events held by sent storages, under dshare_mu */

static void counter_file_close(counter_file *f)
{
    munmap(f->map, COUNTER_FILE_BYTES);
    close(f->fd);
    free(f);
}

/* Takes f out of the open files (under dshare_mu); the caller closes it after unlocking. */
static void counter_file_unlink(counter_file *f)
{
    for (counter_file **p = &counter_files; *p; p = &(*p)->next) {
        if (*p == f) {
            *p = f->next;
            break;
        }
    }
    if (counter_current == f)
        counter_current = NULL;
    counter_files_open--;
}

static td_status counter_file_new(counter_file **out)
{
    int fd = (int)syscall(SYS_memfd_create, "tdist-ipc-refcount", 1u /* MFD_CLOEXEC */);
    if (fd < 0)
        return error_errno(TD_ERR_IO, "sharing a device tensor: memfd_create of a reference-counter file");
    /* Reserve the pages now: a full tmpfs would otherwise raise SIGBUS on first touch. */
    int rc = ftruncate(fd, (off_t)COUNTER_FILE_BYTES) == 0 ? 0 : errno;
    if (rc == 0) {
        while ((rc = posix_fallocate(fd, 0, (off_t)COUNTER_FILE_BYTES)) == EINTR) {
        }
        if (rc == EINVAL || rc == EOPNOTSUPP)
            rc = 0;
    }
    struct stat st;
    void *p = MAP_FAILED;
    if (rc == 0)
        rc = fstat(fd, &st) == 0 ? 0 : errno;
    if (rc == 0)
        p = mmap(NULL, COUNTER_FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        errno = rc ? rc : errno;
        td_status s = error_errno(rc == ENOSPC ? TD_ERR_NOMEM : TD_ERR_IO,
                                  "sharing a device tensor: making a reference-counter file of %zu bytes",
                                  (size_t)COUNTER_FILE_BYTES);
        close(fd);
        return s;
    }
    counter_header *h = p;
    h->magic = COUNTER_MAGIC;
    h->version = COUNTER_VERSION;
    h->slots = DSHARE_COUNTER_SLOTS;
    counter_file *f = TD_NEW(counter_file);
    f->fd = fd;
    f->ino = (uint64_t)st.st_ino;
    f->map = p;
    *out = f;
    return TD_OK;
}

/* A slot for a storage's first export, set to 0 (under dshare_mu). */
static td_status counter_slot_take(counter_file **file, int64_t *slot)
{
    if (!counter_current || counter_current->handed_out == DSHARE_COUNTER_SLOTS) {
        counter_file *f = NULL;
        TD_TRY(counter_file_new(&f));
        f->next = counter_files;
        counter_files = f;
        counter_current = f;
        counter_files_open++;
        counter_files_made++;
    }
    counter_file *f = counter_current;
    *slot = f->handed_out++;
    f->in_use++;
    atomic_store(slot_at(f->map, *slot), 0);
    *file = f;
    return TD_OK;
}

/* Gives back the slot of a destroyed storage (under dshare_mu): a full file whose last slot this
 * was is unlinked and returned for the caller to close after unlocking. */
static counter_file *counter_slot_return(counter_file *f)
{
    if (--f->in_use == 0 && f->handed_out == DSHARE_COUNTER_SLOTS) {
        counter_file_unlink(f);
        return f;
    }
    return NULL;
}

/* ---- the producer side ------------------------------------------------------------------------ */

typedef TD_VEC(td_event *) event_vec;

typedef struct sent_ctx {
    void *data; /* the block (td_device_free'd when done) */
    td_storage *storage; /* not a reference: for its entry in the identity cache */
    char key[192];       /* that entry's key; "" while it has none */
    counter_file *file;
    int64_t slot;      /* messages in flight + consumer storages */
    event_vec events;  /* kept while consumers may still open them */
    struct sent_ctx *next_in_limbo;
} sent_ctx;

static sent_ctx *limbo; /* under dshare_mu */
static size_t limbo_len;
static bool limbo_warned;

static _Atomic int64_t *sent_slot(const sent_ctx *c) { return slot_at(c->file->map, c->slot); }

static void events_release(event_vec *events)
{
    for (size_t i = 0; i < events->len; i++)
        td_event_release(events->items[i]);
    TD_VEC_FREE(events);
}

static void sent_destroy(sent_ctx *c)
{
    td_device_free(c->data);
    pthread_mutex_lock(&dshare_mu);
    events_outstanding -= c->events.len;
    counter_file *close_it = counter_slot_return(c->file);
    pthread_mutex_unlock(&dshare_mu);
    events_release(&c->events);
    if (close_it)
        counter_file_close(close_it);
    free(c);
}

/* Frees the limbo blocks whose slots fell to 0; returns how many are still held. */
static size_t limbo_collect(void)
{
    sent_ctx *done = NULL;
    pthread_mutex_lock(&dshare_mu);
    for (sent_ctx **p = &limbo; *p;) {
        sent_ctx *c = *p;
        if (atomic_load(sent_slot(c)) <= 0) {
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

size_t td_mp_ipc_collect(void)
{
    size_t left = limbo_collect();
    /* torch's safe_clean_current_file: the current file goes too once none of its slots is in use
     * (a later export makes a new one). */
    counter_file *close_it = NULL;
    pthread_mutex_lock(&dshare_mu);
    if (counter_current && counter_current->in_use == 0) {
        close_it = counter_current;
        counter_file_unlink(close_it);
    }
    pthread_mutex_unlock(&dshare_mu);
    if (close_it)
        counter_file_close(close_it);
    return left;
}

static void sent_free(void *data, size_t nbytes, void *p)
{
    (void)data;
    (void)nbytes;
    sent_ctx *c = p;
    pthread_mutex_lock(&dshare_mu);
    identity_forget(c->key, c->storage);
    pthread_mutex_unlock(&dshare_mu);
    if (atomic_load(sent_slot(c)) <= 0) {
        sent_destroy(c);
    } else {
        pthread_mutex_lock(&dshare_mu);
        c->next_in_limbo = limbo;
        limbo = c;
        bool warn = ++limbo_len > LIMBO_WARN_AT && !limbo_warned;
        limbo_warned |= warn;
        pthread_mutex_unlock(&dshare_mu);
        if (warn)
            TD_LOG_WARN("Producer process tried to deallocate over 1000 memory blocks referred by consumer processes. "
                        "Deallocation might be significantly slowed down. We assume it will never going to be the "
                        "case, but if it is, please file but to https://github.com/pytorch/pytorch");
    }
    (void)limbo_collect();
}

static const td_storage_allocator sent_allocator = {.kind = TD_STORAGE_DEVICE, .name = "sent device", .free = sent_free};

/* torch's warning at exit when consumers still hold blocks of this producer. */
static pid_t exit_check_pid;
static pthread_once_t exit_check_once = PTHREAD_ONCE_INIT;

static void limbo_exit_check(void)
{
    if (getpid() != exit_check_pid || pthread_mutex_trylock(&dshare_mu) != 0)
        return; /* a forked child, or a thread stopped holding the lock: no verdict */
    bool held = false;
    for (sent_ctx *c = limbo; c && !held; c = c->next_in_limbo)
        held = atomic_load(sent_slot(c)) > 0;
    pthread_mutex_unlock(&dshare_mu);
    if (held)
        TD_LOG_WARN("Producer process has been terminated before all shared CUDA tensors released. See Note "
                    "[Sharing CUDA tensors]");
}

static void exit_check_register(void)
{
    exit_check_pid = getpid();
    atexit(limbo_exit_check);
}

static td_value *handle_bytes(const void *bytes, size_t len) { return td_value_bytes(bytes, len); }

/* An interprocess event recorded on stream and kept by c, as its handle's bytes; NULL when that
 * failed (the caller synchronizes instead). */
static td_value *record_event(sent_ctx *c, td_stream *stream)
{
    td_event *ev = NULL;
    td_event_ipc_handle eh;
    td_status st = td_event_create(TD_EVENT_INTERPROCESS | TD_EVENT_BLOCKING, &ev);
    if (st == TD_OK)
        st = td_event_record(ev, stream);
    if (st == TD_OK)
        st = td_event_ipc_handle_get(ev, &eh);
    if (st != TD_OK) {
        td_event_release(ev);
        TD_LOG_DEBUG("sharing a device tensor without an event (%s): synchronizing", td_last_error());
        return NULL;
    }
    pthread_mutex_lock(&dshare_mu);
    TD_VEC_PUSH(&c->events, ev);
    pthread_mutex_unlock(&dshare_mu);
    return handle_bytes(eh.bytes, sizeof eh.bytes);
}

/* Enters a sent storage in the identity cache, so that this process receives it as itself. A
 * sent storage's block never moves, so its key is made once, at its first export. */
static void identity_publish(sent_ctx *c, td_device d, const void *mem_handle, int64_t offset)
{
    pthread_mutex_lock(&dshare_mu);
    bool done = c->key[0] != '\0';
    pthread_mutex_unlock(&dshare_mu);
    if (done)
        return;
    char hkey[160], ikey[192];
    identity_keys(d, mem_handle, offset, hkey, ikey);
    td_storage *live = NULL;
    pthread_mutex_lock(&dshare_mu);
    if (!c->key[0]) { /* unless another export of it entered it meanwhile */
        td_storage *old = map_get_str(&identities, ikey);
        live = old ? storage_weak_lock(old) : NULL;
        if (!live) { /* a live entry of the same block is a storage received earlier: it stays */
            if (old) {
                map_remove(&identities, ikey, strlen(ikey));
                storage_weak_release(old);
            }
            map_put(&identities, ikey, strlen(ikey), storage_weak_retain(c->storage));
            snprintf(c->key, sizeof c->key, "%s", ikey);
        }
    }
    pthread_mutex_unlock(&dshare_mu);
    if (live)
        td_storage_release(live);
}

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
    pthread_once(&exit_check_once, exit_check_register);

    (void)limbo_collect();
    event_vec stale = {0};
    pthread_mutex_lock(&dshare_mu);
    td_status st = TD_OK;
    sent_ctx *c = s->allocator == &sent_allocator ? s->allocator_ctx : NULL;
    if (!c) {
        c = TD_NEW(sent_ctx);
        c->data = s->data;
        c->storage = s;
        st = counter_slot_take(&c->file, &c->slot);
        if (st == TD_OK) {
            /* The storage is ours from now on: its last release decides between freeing and limbo. */
            s->allocator = &sent_allocator;
            s->allocator_ctx = c;
        } else {
            free(c);
            c = NULL;
        }
    } else if (atomic_load(sent_slot(c)) <= 0) {
        /* Every earlier message was received and let go, or given back: no consumer can still
         * open their events. */
        stale = c->events;
        memset(&c->events, 0, sizeof c->events);
        events_outstanding -= stale.len;
    }
    bool use_event = false;
    if (c) {
        atomic_fetch_add(sent_slot(c), 1); /* the message's reference, before it is published */
        use_event = events_outstanding < DSHARE_EVENT_BUDGET;
        if (use_event)
            events_outstanding++;
    }
    pthread_mutex_unlock(&dshare_mu);
    events_release(&stale);
    TD_TRY(st);

    /* The consumer's stream waits for the work queued so far on the producer's current stream:
     * through an event within the budget, else the producer's stream is synchronized now. */
    td_stream *stream = NULL;
    td_value *event_value = NULL;
    st = td_stream_current(seg_device, &stream);
    if (st == TD_OK && use_event)
        event_value = record_event(c, stream);
    if (use_event && !event_value) {
        pthread_mutex_lock(&dshare_mu);
        events_outstanding--;
        pthread_mutex_unlock(&dshare_mu);
    }
    if (st == TD_OK && !event_value)
        st = td_stream_synchronize(stream);
    if (st != TD_OK) {
        atomic_fetch_sub(sent_slot(c), 1);
        return st;
    }
    bool sync_required = event_value != NULL;
    if (!event_value)
        event_value = td_value_none();
    uintptr_t offset = (uintptr_t)s->data - (uintptr_t)base;
    identity_publish(c, seg_device, mh.bytes, (int64_t)offset);
    *entry = td_value_tuple_of(
        13, td_value_int(TD_SHM_DEVICE), td_value_int((int64_t)s->nbytes), td_value_int(seg_device.type),
        td_value_int(seg_device.index), handle_bytes(mh.bytes, sizeof mh.bytes), td_value_int((int64_t)seg_size),
        td_value_int((int64_t)offset), td_value_int((int64_t)getpid()), td_value_int(c->file->fd),
        td_value_int((int64_t)c->file->ino), td_value_int(c->slot), event_value, td_value_bool(sync_required));
    return TD_OK;
}

void dshare_abandon(const td_storage *s)
{
    if (s->allocator == &sent_allocator)
        atomic_fetch_sub(sent_slot(s->allocator_ctx), 1);
}

void dshare_stats_get(dshare_stats *out)
{
    pthread_mutex_lock(&dshare_mu);
    out->counter_files = counter_files_open;
    out->counter_files_made = counter_files_made;
    out->events = events_outstanding;
    out->limbo = limbo_len;
    pthread_mutex_unlock(&dshare_mu);
}

int64_t dshare_slot_value(const td_storage *s)
{
    return s->allocator == &sent_allocator ? atomic_load(sent_slot(s->allocator_ctx)) : -1;
}

/* ---- the consumer side ------------------------------------------------------------------------ */

/* A producer's counter file as this process maps it, while storages here hold slots in it. */
typedef struct counter_view {
    void *map;
    long refs; /* under dshare_mu */
    char key[72];
} counter_view;

typedef struct opened_base {
    td_device device;
    void *base;
    size_t size;
    long storages; /* under dshare_mu */
    char key[160];
} opened_base;

typedef struct received_ctx {
    opened_base *opened;
    counter_view *counter; /* NULL when the producer's file could not be opened */
    int64_t slot;
    td_storage *storage; /* not a reference: for the identity cache entry */
    char key[192];
} received_ctx;

static td_map bases = TD_MAP_INIT;         /* handle key -> opened_base * */
static td_map counter_views = TD_MAP_INIT; /* "pid:fd:ino" -> counter_view * */

static bool counter_stat_ok(const struct stat *st, int64_t ino)
{
    return S_ISREG(st->st_mode) && (uint64_t)st->st_ino == (uint64_t)ino && st->st_size == (off_t)COUNTER_FILE_BYTES;
}

/* The producer's counter file named by (pid, fd, ino), mapped; NULL when it is gone or is not one. */
static void *counter_map_open(int64_t pid, int64_t fd, int64_t ino)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%lld/fd/%lld", (long long)pid, (long long)fd);
    struct stat st;
    if (stat(path, &st) != 0 || !counter_stat_ok(&st, ino))
        return NULL; /* checked before opening: the name may be any file of that process */
    int f = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (f < 0)
        return NULL;
    void *p = MAP_FAILED;
    if (fstat(f, &st) == 0 && counter_stat_ok(&st, ino))
        p = mmap(NULL, COUNTER_FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    close(f);
    if (p == MAP_FAILED)
        return NULL;
    const counter_header *h = p;
    if (h->magic != COUNTER_MAGIC || h->version != COUNTER_VERSION || h->slots != DSHARE_COUNTER_SLOTS) {
        munmap(p, COUNTER_FILE_BYTES);
        return NULL;
    }
    return p;
}

/* A reference to this process's mapping of the file, opened on first use (best effort: NULL). */
static counter_view *counter_view_acquire(int64_t pid, int64_t fd, int64_t ino)
{
    char key[72];
    snprintf(key, sizeof key, "%lld:%lld:%lld", (long long)pid, (long long)fd, (long long)ino);
    pthread_mutex_lock(&dshare_mu);
    counter_view *v = map_get_str(&counter_views, key);
    if (v)
        v->refs++;
    pthread_mutex_unlock(&dshare_mu);
    if (v)
        return v;
    void *map = counter_map_open(pid, fd, ino);
    if (!map)
        return NULL;
    counter_view *fresh = TD_NEW(counter_view);
    fresh->map = map;
    fresh->refs = 1;
    snprintf(fresh->key, sizeof fresh->key, "%s", key);
    pthread_mutex_lock(&dshare_mu);
    v = map_get_str(&counter_views, key);
    if (v) {
        v->refs++; /* another thread opened it meanwhile */
    } else {
        map_put(&counter_views, fresh->key, strlen(fresh->key), fresh);
        v = fresh;
        fresh = NULL;
    }
    pthread_mutex_unlock(&dshare_mu);
    if (fresh) {
        munmap(fresh->map, COUNTER_FILE_BYTES);
        free(fresh);
    }
    return v;
}

static void counter_view_release(counter_view *v)
{
    if (!v)
        return;
    pthread_mutex_lock(&dshare_mu);
    bool last = --v->refs == 0;
    if (last)
        map_remove(&counter_views, v->key, strlen(v->key));
    pthread_mutex_unlock(&dshare_mu);
    if (last) {
        munmap(v->map, COUNTER_FILE_BYTES);
        free(v);
    }
}

/* Gives one reference of the producer's slot back (a message this process will not keep). */
static void counter_give_back(int64_t pid, int64_t fd, int64_t ino, int64_t slot)
{
    counter_view *v = counter_view_acquire(pid, fd, ino);
    if (v)
        atomic_fetch_sub(slot_at(v->map, slot), 1);
    counter_view_release(v);
}

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
    if (c->counter)
        atomic_fetch_sub(slot_at(c->counter->map, c->slot), 1);
    counter_view_release(c->counter);
    opened_base *close_it = NULL;
    pthread_mutex_lock(&dshare_mu);
    identity_forget(c->key, c->storage);
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

/* The fields of a device storage entry, checked. */
typedef struct device_entry {
    int64_t nbytes, type, index, seg_size, offset, pid, counter_fd, counter_ino, slot;
    const void *mem_handle;
    const void *event_handle; /* NULL: the producer synchronized */
} device_entry;

static td_status parse_entry(const td_value *e, device_entry *x)
{
    bool arity = td_value_len(e) == DSHARE_ENTRY_LEN;
    const td_value *mhv = arity ? td_value_at(e, 4) : NULL;
    const td_value *ehv = arity ? td_value_at(e, 11) : NULL;
    const td_value *syncv = arity ? td_value_at(e, 12) : NULL;
    size_t mh_len = 0, eh_len = 0;
    x->mem_handle = mhv && td_value_kind_of(mhv) == TD_VAL_BYTES ? td_value_get_bytes(mhv, &mh_len) : NULL;
    x->event_handle = ehv && td_value_kind_of(ehv) == TD_VAL_BYTES ? td_value_get_bytes(ehv, &eh_len) : NULL;
    if (!arity || !get_i(e, 1, &x->nbytes) || !get_i(e, 2, &x->type) || !get_i(e, 3, &x->index) ||
        !get_i(e, 5, &x->seg_size) || !get_i(e, 6, &x->offset) || !get_i(e, 7, &x->pid) ||
        !get_i(e, 8, &x->counter_fd) || !get_i(e, 9, &x->counter_ino) || !get_i(e, 10, &x->slot) || !x->mem_handle ||
        mh_len != sizeof(device_mem_ipc_handle) ||
        (td_value_kind_of(ehv) != TD_VAL_NONE && (!x->event_handle || eh_len != sizeof(td_event_ipc_handle))) ||
        td_value_kind_of(syncv) != TD_VAL_BOOL)
        return bad_entry("a device storage entry is not (3, nbytes, type, index, handle, segment size, offset, pid, "
                         "counter fd, counter inode, counter slot, event handle, event_sync_required)");
    if (td_value_get_bool(syncv) != (x->event_handle != NULL))
        return bad_entry("a device storage entry's event_sync_required does not match its event handle");
    if ((x->type != TD_DEVICE_CUDA && x->type != TD_DEVICE_SIM) || x->index < 0 || x->index > INT32_MAX ||
        x->nbytes <= 0 || x->seg_size <= 0 || x->offset < 0 || x->offset > x->seg_size ||
        x->nbytes > x->seg_size - x->offset)
        return bad_entry("a device storage entry has a bad device, size or offset");
    if (x->pid <= 0 || x->pid > INT32_MAX || x->counter_fd < 0 || x->counter_fd > INT32_MAX || x->counter_ino < 0 ||
        x->slot < 0 || x->slot >= DSHARE_COUNTER_SLOTS)
        return bad_entry("a device storage entry has a bad reference counter (pid, fd, inode or slot)");
    return TD_OK;
}

/* Opens (or finds) this process's mapping of the segment; the caller holds one storage count. */
static td_status base_acquire(const device_impl *impl, td_device d, const device_entry *x, const char *hkey,
                              opened_base **out)
{
    pthread_mutex_lock(&dshare_mu);
    opened_base *ob = map_get_str(&bases, hkey);
    if (ob)
        ob->storages++;
    pthread_mutex_unlock(&dshare_mu);
    if (ob) {
        *out = ob;
        return TD_OK;
    }
    device_mem_ipc_handle mh;
    memcpy(mh.bytes, x->mem_handle, sizeof mh.bytes);
    void *base = NULL;
    TD_TRY(impl->mem_open_ipc(d.index, &mh, (size_t)x->seg_size, &base));
    opened_base *fresh = TD_NEW(opened_base);
    fresh->device = d;
    fresh->base = base;
    fresh->size = (size_t)x->seg_size;
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
    *out = ob;
    return TD_OK;
}

static td_status wait_producer_event(td_device d, const void *handle_bytes_in)
{
    td_event_ipc_handle eh;
    memcpy(eh.bytes, handle_bytes_in, sizeof eh.bytes);
    td_event *ev = NULL;
    td_stream *stream = NULL;
    td_status st = td_event_from_ipc_handle(d, &eh, &ev);
    if (st == TD_OK)
        st = td_stream_current(d, &stream);
    if (st == TD_OK)
        st = td_stream_wait_event(stream, ev);
    td_event_release(ev);
    return st == TD_OK ? TD_OK : error_prefix(st, "receiving a device tensor: waiting for the producer's event");
}

void dshare_abandon_entry(const td_value *e)
{
    /* Only the counter's fields, checked as parse_entry does, and no error set: the caller is
     * failing with its own. */
    int64_t pid, fd, ino, slot;
    if (td_value_len(e) == DSHARE_ENTRY_LEN && get_i(e, 7, &pid) && get_i(e, 8, &fd) && get_i(e, 9, &ino) &&
        get_i(e, 10, &slot) && pid > 0 && pid <= INT32_MAX && fd >= 0 && fd <= INT32_MAX && ino >= 0 && slot >= 0 &&
        slot < DSHARE_COUNTER_SLOTS)
        counter_give_back(pid, fd, ino, slot);
}

td_status dshare_import(const td_value *e, td_storage **out)
{
    device_entry x;
    TD_TRY(parse_entry(e, &x));
    td_device d = {(td_device_type)x.type, (int)x.index};
    const device_impl *impl;
    td_status st = device_check(d, &impl, &d.index);
    if (st != TD_OK) {
        counter_give_back(x.pid, x.counter_fd, x.counter_ino, x.slot);
        return st;
    }

    /* Keys: the memory handle, and the handle with the offset. */
    char hkey[160], ikey[192];
    identity_keys(d, x.mem_handle, x.offset, hkey, ikey);

    pthread_mutex_lock(&dshare_mu);
    td_storage *known = map_get_str(&identities, ikey);
    known = known ? storage_weak_lock(known) : NULL;
    pthread_mutex_unlock(&dshare_mu);
    if (known) {
        /* This process holds the storage already, and with it a counter reference: give back the
         * message's. */
        counter_give_back(x.pid, x.counter_fd, x.counter_ino, x.slot);
        *out = known;
        return TD_OK;
    }

    /* The producer's work on the memory comes first. */
    opened_base *ob = NULL;
    st = x.event_handle ? wait_producer_event(d, x.event_handle) : TD_OK;
    if (st == TD_OK)
        st = base_acquire(impl, d, &x, hkey, &ob);
    if (st != TD_OK) {
        counter_give_back(x.pid, x.counter_fd, x.counter_ino, x.slot);
        return st;
    }
    received_ctx *c = TD_NEW(received_ctx);
    c->opened = ob;
    c->counter = counter_view_acquire(x.pid, x.counter_fd, x.counter_ino);
    c->slot = x.slot;
    snprintf(c->key, sizeof c->key, "%s", ikey);
    td_storage *s = storage_new_with((char *)ob->base + x.offset, (size_t)x.nbytes, d, &received_allocator, c, false);
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
