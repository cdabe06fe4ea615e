/* The host-simulated device implementation (device_sim_impl): TDIST_SIM_DEVICES devices whose
 * memory is host memory under a per-device budget (TDIST_SIM_MEMORY) and whose streams are FIFOs of
 * work items, each run in order by its own thread.
 *
 * This is what lets multi-device code (the caching allocator, stream and event ordering, the comm
 * primitives) be developed and tested on a machine without a GPU. Time is real: a sleep item
 * sleeps, and the clock rate is 1 GHz, so a cycle is a nanosecond.
 *
 * Ordering: each stream numbers the items it accepts (seq 1, 2, ...) and publishes the number of
 * the last one its thread finished (completed). An event's record is a work item on its stream;
 * the event captures (stream, seq of that item) and is reached once completed >= seq, when the
 * item also stamps the time. A wait-event item blocks its stream's thread on the captured stream's
 * condition variable until that stream reaches the capture, across devices too. Streams and events
 * are reference counted internally, so a capture or a queued item keeps what it points at alive
 * after the front end destroyed it (a destroyed stream is drained and its thread joined first).
 *
 * Interprocess events (TD_EVENT_INTERPROCESS) keep their state in a shared page of a memfd
 * instead of a capture: records are numbered across every process that maps the page, a record
 * item raises the page's completed number when it runs and wakes futex waiters, and query,
 * synchronize and stream waits compare against the latest record number. The handle names the
 * page as /proc/<pid>/fd/<fd> with the file's identity and a nonce.
 *
 * Locks: one global lock (sim_lock) for the device table (budgets, bytes in use, stream lists,
 * default streams); one per stream for its queue and counters; one per event for its capture. The
 * order is event -> stream; sim_lock is never held while taking another. Waits hold only the lock
 * of the stream they wait on. */
#include "device/device_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <tdist/tensor.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/ref.h"
#include "base/thread.h"
#include "device/philox.h"
#include "tensor/half.h" /* header-only float16 / bfloat16 rounding, as the tensor layer's */

#define SIM_ALIGN 256
#define SIM_HEADER 256 /* bytes before each device block: its size and device, alignment kept */
#define SIM_CLOCK_KHZ 1000000
#define SIM_DEFAULT_BUDGET ((uint64_t)4 << 30)
#define SIM_BLOCK_MAGIC 0x73696d626c6f636bULL /* "simblock" */

/* ---- streams and work items ------------------------------------------------------------------ */

typedef struct sim_stream sim_stream;
typedef struct sim_event sim_event;

typedef enum sim_op {
    SIM_OP_COPY = 0,   /* memcpy of every kind, peer copies too */
    SIM_OP_STRIDED,
    SIM_OP_FILL,
    SIM_OP_ADD,
    SIM_OP_SLEEP,
    SIM_OP_RANDOM,
    SIM_OP_RECORD,
    SIM_OP_WAIT,
    SIM_OP_WAIT_IPC, /* wait for an interprocess event's shared state */
} sim_op;

typedef struct sim_item {
    struct sim_item *next;
    sim_op op;
    uint64_t seq;
    union {
        struct {
            void *dst;
            const void *src;
            size_t nbytes;
        } copy;
        struct {
            device_strided dst, src;
            size_t elem_size;
        } strided;
        struct {
            void *dst;
            size_t count, elem_size;
            unsigned char value[16];
        } fill;
        struct {
            void *dst;
            const void *a, *b;
            size_t count;
            td_reduce_fn kernel;
        } add;
        struct {
            int64_t ns;
        } sleep;
        struct {
            void *dst;
            size_t count;
            td_dtype dtype;
            int dist;
            double a, b;
            uint64_t seed, offset;
        } random;
        struct {
            sim_event *event;   /* a reference */
            sim_stream *stream; /* the stream running the item */
            uint64_t ipc_target; /* interprocess events: the record's number in the shared page */
        } record;
        struct {
            sim_stream *stream; /* a reference */
            uint64_t seq;
        } wait;
        struct {
            sim_event *event; /* a reference */
            uint64_t target;
        } wait_ipc;
    } u;
} sim_item;

struct sim_stream {
    td_ref refs;           /* the device's list holds one until destroy/shutdown; captures hold more */
    int dev;
    int priority;
    bool is_default;
    pthread_mutex_t lock;
    pthread_cond_t cond;   /* enqueue, completion and stop */
    sim_item *head, *tail;
    uint64_t enqueued;     /* seq of the last item accepted */
    uint64_t completed;    /* seq of the last item finished */
    bool stopping;
    bool thread_started;
    pthread_t thread;
    sim_stream *next_in_device; /* under sim_lock */
};

/* The shared state of an interprocess event: one page of a memfd that every process holding the
 * event maps. Records are numbered across processes (recorded); the stream item of record n
 * raises completed to n when it runs, and bumps the futex word wake. The event is reached when
 * completed >= recorded: as with CUDA events, the latest record is the one that counts. */
typedef struct sim_ipc_page {
    uint32_t magic;
    uint32_t version;
    uint64_t nonce;              /* random: a handle names this page and no other */
    _Atomic uint64_t recorded;
    _Atomic uint64_t completed;
    _Atomic uint32_t wake;
} sim_ipc_page;

#define SIM_IPC_MAGIC 0x45534454u /* "TDSE" */
#define SIM_IPC_PAGE 4096

struct sim_event {
    td_ref refs;           /* the front end's one, plus one per queued record item */
    int dev;
    unsigned flags;
    pthread_mutex_t lock;
    sim_stream *stream;    /* the capture (a reference); NULL until recorded */
    uint64_t seq;
    bool stamped;          /* the capture was reached with timing on */
    int64_t stamp_ns;
    sim_ipc_page *page;    /* interprocess events: the shared state (mapped), else NULL */
    int page_fd;           /* its memfd, kept so the handle can name it (/proc/<pid>/fd/<fd>) */
    uint64_t page_dev, page_ino;
};

/* ---- the device table ------------------------------------------------------------------------ */

typedef struct sim_device {
    uint64_t in_use;
    sim_stream *default_stream;
    sim_stream *streams;   /* every live stream of the device, default included */
} sim_device;

static pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int sim_count_loaded = -1; /* -1: read the environment at the next use */
static uint64_t sim_budget = SIM_DEFAULT_BUDGET;
static sim_device sim_devices[DEVICE_MAX_DEVICES];
static atomic_llong sim_threads_running;

static int sim_count(void)
{
    int n = atomic_load_explicit(&sim_count_loaded, memory_order_acquire);
    if (n >= 0)
        return n;
    pthread_mutex_lock(&sim_lock);
    n = atomic_load_explicit(&sim_count_loaded, memory_order_relaxed);
    if (n < 0) {
        int64_t count = 0;
        if (env_get_int("TDIST_SIM_DEVICES", 0, 0, DEVICE_MAX_DEVICES, &count) != TD_OK) {
            TD_LOG_WARN("%s; using 0 simulated devices", td_last_error());
            error_clear();
            count = 0;
        }
        uint64_t budget = SIM_DEFAULT_BUDGET;
        const char *mem = env_get_str("TDIST_SIM_MEMORY", NULL);
        if (mem && env_parse_size("TDIST_SIM_MEMORY", mem, &budget) != TD_OK) {
            TD_LOG_WARN("%s; using 4 GiB per simulated device", td_last_error());
            error_clear();
            budget = SIM_DEFAULT_BUDGET;
        }
        sim_budget = budget;
        n = (int)count;
        atomic_store_explicit(&sim_count_loaded, n, memory_order_release);
    }
    pthread_mutex_unlock(&sim_lock);
    return n;
}

static td_status sim_check_dev(int dev)
{
    int n = sim_count();
    if (dev < 0 || dev >= n)
        return error_fmt(TD_ERR_INVALID, "sim error: invalid device ordinal %d (there are %d sim devices)", dev, n);
    return TD_OK;
}

/* PyTorch's format_size: "512 bytes", "1.50 KiB", "20.00 MiB", "4.00 GiB". */
static void sim_format_size(uint64_t bytes, char *buf, size_t len)
{
    if (bytes < 1024)
        snprintf(buf, len, "%" PRIu64 " bytes", bytes);
    else if (bytes < ((uint64_t)1 << 20))
        snprintf(buf, len, "%.2f KiB", (double)bytes / 1024.0);
    else if (bytes < ((uint64_t)1 << 30))
        snprintf(buf, len, "%.2f MiB", (double)bytes / (1024.0 * 1024.0));
    else
        snprintf(buf, len, "%.2f GiB", (double)bytes / (1024.0 * 1024.0 * 1024.0));
}

/* ---- stream objects ------------------------------------------------------------------------- */

static void sim_stream_release(sim_stream *s)
{
    if (s && ref_dec(&s->refs)) {
        pthread_mutex_destroy(&s->lock);
        pthread_cond_destroy(&s->cond);
        free(s);
    }
}

static void sim_event_release(sim_event *e)
{
    if (e && ref_dec(&e->refs)) {
        if (e->page)
            munmap(e->page, SIM_IPC_PAGE);
        if (e->page_fd >= 0)
            close(e->page_fd);
        sim_stream_release(e->stream);
        pthread_mutex_destroy(&e->lock);
        free(e);
    }
}

/* The capture of e with a reference on its stream (NULL: never recorded). */
static sim_stream *sim_event_capture(sim_event *e, uint64_t *seq)
{
    pthread_mutex_lock(&e->lock);
    sim_stream *s = e->stream;
    *seq = e->seq;
    if (s)
        ref_inc(&s->refs);
    pthread_mutex_unlock(&e->lock);
    return s;
}

/* Waits (holding only s's lock) until s has finished the item numbered seq. */
static void sim_stream_wait_seq(sim_stream *s, uint64_t seq)
{
    pthread_mutex_lock(&s->lock);
    while (s->completed < seq)
        pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
}

static bool sim_stream_reached(sim_stream *s, uint64_t seq)
{
    pthread_mutex_lock(&s->lock);
    bool done = s->completed >= seq;
    pthread_mutex_unlock(&s->lock);
    return done;
}

static void sim_copy_elem(unsigned char *dst, const unsigned char *src, size_t elem_size)
{
    switch (elem_size) {
    case 1: memcpy(dst, src, 1); break;
    case 2: memcpy(dst, src, 2); break;
    case 4: memcpy(dst, src, 4); break;
    case 8: memcpy(dst, src, 8); break;
    default: memcpy(dst, src, 16); break;
    }
}

static int64_t sim_numel(const device_strided *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->sizes[d];
    return n;
}

/* Advances a multi-index over t's sizes (last dimension fastest) and returns the element offset. */
static int64_t sim_next_offset(const device_strided *t, int64_t *index, int64_t offset)
{
    for (int d = t->ndim - 1; d >= 0; d--) {
        index[d]++;
        offset += t->strides[d];
        if (index[d] < t->sizes[d])
            return offset;
        offset -= t->strides[d] * t->sizes[d];
        index[d] = 0;
    }
    return offset;
}

static void sim_run_strided(const device_strided *dst, const device_strided *src, size_t elem_size)
{
    int64_t n = sim_numel(dst);
    int64_t dst_index[DEVICE_MAX_KERNEL_DIMS] = {0}, src_index[DEVICE_MAX_KERNEL_DIMS] = {0};
    int64_t dst_off = 0, src_off = 0;
    unsigned char *dbase = dst->base;
    const unsigned char *sbase = src->base;
    for (int64_t i = 0; i < n; i++) {
        sim_copy_elem(dbase + dst_off * (int64_t)elem_size, sbase + src_off * (int64_t)elem_size, elem_size);
        if (i + 1 < n) {
            dst_off = sim_next_offset(dst, dst_index, dst_off);
            src_off = sim_next_offset(src, src_index, src_off);
        }
    }
}

/* The random kernel: philox.h's blocks, element by element, stored in the tensor's dtype. */
static void sim_run_random(void *dst, size_t count, td_dtype dtype, int dist, double a, double b, uint64_t seed,
                           uint64_t offset)
{
    int is_double = dtype == TD_FLOAT64;
    int per = philox_per_block(is_double);
    for (size_t group = 0; group * (size_t)per < count; group++) {
        philox_block block = philox_group_block(seed, offset, group);
        for (int lane = 0; lane < per && group * (size_t)per + (size_t)lane < count; lane++) {
            size_t i = group * (size_t)per + (size_t)lane;
            double v = philox_value(block, lane, is_double, dist, a, b);
            switch (dtype) {
            case TD_FLOAT64:
                ((double *)dst)[i] = v;
                break;
            case TD_FLOAT32:
                ((float *)dst)[i] = (float)v;
                break;
            case TD_FLOAT16:
                ((uint16_t *)dst)[i] = f2h((float)v);
                break;
            default: /* TD_BFLOAT16: sim_random admits nothing else */
                ((uint16_t *)dst)[i] = f2bf((float)v);
                break;
            }
        }
    }
}

/* ---- interprocess event state ------------------------------------------------------------- */

static long sim_futex(_Atomic uint32_t *word, int op, uint32_t value, const struct timespec *timeout)
{
    /* Not the private variant: the word is shared between processes. */
    return syscall(SYS_futex, (uint32_t *)word, op, value, timeout, NULL, 0);
}

/* Record number target is done: completed rises to it (never falls) and waiters wake. */
static void sim_ipc_complete(sim_ipc_page *page, uint64_t target)
{
    uint64_t seen = atomic_load(&page->completed);
    while (seen < target && !atomic_compare_exchange_weak(&page->completed, &seen, target)) {
    }
    atomic_fetch_add(&page->wake, 1);
    sim_futex(&page->wake, FUTEX_WAKE, INT_MAX, NULL);
}

static bool sim_ipc_reached(sim_ipc_page *page, uint64_t target) { return atomic_load(&page->completed) >= target; }

/* Waits until record number target is done (in whichever process runs it). The futex sleep has a
 * timeout only as a guard against a wake lost to a process that died mid-way. */
static void sim_ipc_wait(sim_ipc_page *page, uint64_t target)
{
    for (;;) {
        uint32_t word = atomic_load(&page->wake);
        if (sim_ipc_reached(page, target))
            return;
        struct timespec ts = {0, 50 * 1000 * 1000};
        sim_futex(&page->wake, FUTEX_WAIT, word, &ts);
    }
}

/* Maps a shared page from fd (kept by the event) and checks what it holds. */
static td_status sim_ipc_map(sim_event *e, int fd, bool create)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return error_errno(TD_ERR_IO, "sim interprocess event: fstat");
    if (!create && st.st_size < SIM_IPC_PAGE)
        return error_fmt(TD_ERR_INVALID, "sim interprocess event: the handle names a file of %lld bytes, not an event",
                         (long long)st.st_size);
    void *page = mmap(NULL, SIM_IPC_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (page == MAP_FAILED)
        return error_errno(TD_ERR_IO, "sim interprocess event: mmap");
    e->page = page;
    e->page_fd = fd;
    e->page_dev = (uint64_t)st.st_dev;
    e->page_ino = (uint64_t)st.st_ino;
    return TD_OK;
}

static td_status sim_ipc_create(sim_event *e)
{
    int fd = (int)syscall(SYS_memfd_create, "tdist-sim-event", 1u /* MFD_CLOEXEC */);
    if (fd < 0)
        return error_errno(TD_ERR_IO, "sim interprocess event: memfd_create");
    if (ftruncate(fd, SIM_IPC_PAGE) != 0) {
        td_status st = error_errno(TD_ERR_IO, "sim interprocess event: ftruncate");
        close(fd);
        return st;
    }
    td_status st = sim_ipc_map(e, fd, true);
    if (st != TD_OK) {
        close(fd);
        return st;
    }
    uint64_t nonce = 0;
    if (syscall(SYS_getrandom, &nonce, sizeof nonce, 0) != (long)sizeof nonce)
        nonce = (uint64_t)clock_now_ns() ^ ((uint64_t)getpid() << 32);
    e->page->nonce = nonce;
    e->page->version = 1;
    atomic_store(&e->page->recorded, 0);
    atomic_store(&e->page->completed, 0);
    e->page->magic = SIM_IPC_MAGIC;
    return TD_OK;
}

static bool sim_event_timed(const sim_event *e)
{
    return (e->flags & TD_EVENT_ENABLE_TIMING) && !(e->flags & TD_EVENT_INTERPROCESS);
}

static void sim_run_item(sim_item *item)
{
    switch (item->op) {
    case SIM_OP_COPY:
        if (item->u.copy.nbytes && item->u.copy.dst != item->u.copy.src)
            memmove(item->u.copy.dst, item->u.copy.src, item->u.copy.nbytes);
        break;
    case SIM_OP_STRIDED:
        sim_run_strided(&item->u.strided.dst, &item->u.strided.src, item->u.strided.elem_size);
        break;
    case SIM_OP_FILL: {
        unsigned char *dst = item->u.fill.dst;
        size_t es = item->u.fill.elem_size;
        for (size_t i = 0; i < item->u.fill.count; i++)
            memcpy(dst + i * es, item->u.fill.value, es);
        break;
    }
    case SIM_OP_ADD:
        item->u.add.kernel(item->u.add.dst, item->u.add.a, item->u.add.b, item->u.add.count);
        break;
    case SIM_OP_SLEEP:
        if (item->u.sleep.ns > 0)
            clock_sleep_ns(item->u.sleep.ns);
        break;
    case SIM_OP_RANDOM:
        sim_run_random(item->u.random.dst, item->u.random.count, item->u.random.dtype, item->u.random.dist,
                       item->u.random.a, item->u.random.b, item->u.random.seed, item->u.random.offset);
        break;
    case SIM_OP_RECORD: {
        sim_event *e = item->u.record.event;
        if (e->page) {
            sim_ipc_complete(e->page, item->u.record.ipc_target);
            break;
        }
        int64_t now = clock_now_ns();
        pthread_mutex_lock(&e->lock);
        /* Only the latest capture is stamped: a re-record replaced an older one. */
        if (e->stream == item->u.record.stream && e->seq == item->seq && sim_event_timed(e)) {
            e->stamped = true;
            e->stamp_ns = now;
        }
        pthread_mutex_unlock(&e->lock);
        break;
    }
    case SIM_OP_WAIT:
        sim_stream_wait_seq(item->u.wait.stream, item->u.wait.seq);
        break;
    case SIM_OP_WAIT_IPC:
        sim_ipc_wait(item->u.wait_ipc.event->page, item->u.wait_ipc.target);
        break;
    }
}

static void sim_item_free(sim_item *item)
{
    if (item->op == SIM_OP_RECORD)
        sim_event_release(item->u.record.event);
    else if (item->op == SIM_OP_WAIT_IPC)
        sim_event_release(item->u.wait_ipc.event);
    else if (item->op == SIM_OP_WAIT)
        sim_stream_release(item->u.wait.stream);
    free(item);
}

static void *sim_stream_main(void *arg)
{
    sim_stream *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->stopping)
            pthread_cond_wait(&s->cond, &s->lock);
        if (!s->head)
            break; /* stopping, and drained */
        sim_item *item = s->head;
        s->head = item->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&s->lock);
        sim_run_item(item);
        uint64_t seq = item->seq;
        sim_item_free(item);
        pthread_mutex_lock(&s->lock);
        s->completed = seq;
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static td_status sim_stream_new(int dev, int priority, bool is_default, sim_stream **out)
{
    sim_stream *s = TD_NEW(sim_stream);
    ref_init(&s->refs);
    s->dev = dev;
    s->priority = priority;
    s->is_default = is_default;
    thread_mutex_init(&s->lock);
    pthread_cond_init(&s->cond, NULL);
    char name[16];
    snprintf(name, sizeof name, "td-sim%d-%s", dev, is_default ? "def" : "str");
    td_status st = thread_start(&s->thread, name, sim_stream_main, s);
    if (st != TD_OK) {
        sim_stream_release(s);
        return st;
    }
    s->thread_started = true;
    atomic_fetch_add(&sim_threads_running, 1);
    /* A forked child would not have this thread: poison sim in children (runtime.c). */
    device_mark_initialized(TD_DEVICE_SIM, true);
    *out = s;
    return TD_OK;
}

/* Drains the queue, joins the thread and drops the device list's reference. */
static void sim_stream_stop(sim_stream *s)
{
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    if (s->thread_started) {
        thread_join(s->thread);
        s->thread_started = false;
        atomic_fetch_sub(&sim_threads_running, 1);
    }
    sim_stream_release(s);
}

/* The stream a native handle names on dev: NULL is dev's default stream, created at first use. */
static td_status sim_stream_of(int dev, void *native, sim_stream **out)
{
    if (native) {
        *out = native;
        return TD_OK;
    }
    TD_TRY(sim_check_dev(dev));
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = sim_devices[dev].default_stream;
    pthread_mutex_unlock(&sim_lock);
    if (s) {
        *out = s;
        return TD_OK;
    }
    sim_stream *fresh = NULL;
    TD_TRY(sim_stream_new(dev, 0, true, &fresh));
    pthread_mutex_lock(&sim_lock);
    s = sim_devices[dev].default_stream;
    if (!s) {
        s = fresh;
        fresh = NULL;
        sim_devices[dev].default_stream = s;
        s->next_in_device = sim_devices[dev].streams;
        sim_devices[dev].streams = s;
    }
    pthread_mutex_unlock(&sim_lock);
    if (fresh)
        sim_stream_stop(fresh); /* another thread created it first */
    *out = s;
    return TD_OK;
}

/* Appends an item (taking it) and returns its seq. */
static uint64_t sim_enqueue_locked(sim_stream *s, sim_item *item)
{
    item->seq = ++s->enqueued;
    item->next = NULL;
    if (s->tail)
        s->tail->next = item;
    else
        s->head = item;
    s->tail = item;
    pthread_cond_broadcast(&s->cond);
    return item->seq;
}

static void sim_enqueue_on(sim_stream *s, sim_item *item)
{
    pthread_mutex_lock(&s->lock);
    sim_enqueue_locked(s, item);
    pthread_mutex_unlock(&s->lock);
}

static td_status sim_enqueue(int dev, void *native, sim_item *item)
{
    sim_stream *s = NULL;
    td_status st = sim_stream_of(dev, native, &s);
    if (st != TD_OK) {
        sim_item_free(item);
        return st;
    }
    sim_enqueue_on(s, item);
    return TD_OK;
}

static sim_item *sim_item_new(sim_op op)
{
    sim_item *item = TD_NEW(sim_item);
    item->op = op;
    return item;
}

/* ---- devices -------------------------------------------------------------------------------- */

static td_status sim_properties(int dev, td_device_properties *out)
{
    TD_TRY(sim_check_dev(dev));
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "tdist simulated device");
    pthread_mutex_lock(&sim_lock);
    out->total_memory = (size_t)sim_budget;
    pthread_mutex_unlock(&sim_lock);
    out->major = 0;
    out->minor = 0;
    out->multi_processor_count = 1;
    out->clock_rate_khz = SIM_CLOCK_KHZ;
    return TD_OK;
}

static td_status sim_mem_get_info(int dev, size_t *free_bytes, size_t *total_bytes)
{
    TD_TRY(sim_check_dev(dev));
    pthread_mutex_lock(&sim_lock);
    uint64_t budget = sim_budget, used = sim_devices[dev].in_use;
    pthread_mutex_unlock(&sim_lock);
    *free_bytes = (size_t)(used < budget ? budget - used : 0);
    *total_bytes = (size_t)budget;
    return TD_OK;
}

static td_status sim_device_synchronize(int dev)
{
    TD_TRY(sim_check_dev(dev));
    /* Snapshot the device's streams with references, then wait on each without sim_lock. */
    pthread_mutex_lock(&sim_lock);
    size_t n = 0;
    for (sim_stream *s = sim_devices[dev].streams; s; s = s->next_in_device)
        n++;
    sim_stream **list = n ? TD_NEW_ARRAY(sim_stream *, n) : NULL;
    size_t i = 0;
    for (sim_stream *s = sim_devices[dev].streams; s; s = s->next_in_device) {
        ref_inc(&s->refs);
        list[i++] = s;
    }
    pthread_mutex_unlock(&sim_lock);
    for (i = 0; i < n; i++) {
        pthread_mutex_lock(&list[i]->lock);
        uint64_t target = list[i]->enqueued;
        pthread_mutex_unlock(&list[i]->lock);
        sim_stream_wait_seq(list[i], target);
        sim_stream_release(list[i]);
    }
    free(list);
    return TD_OK;
}

static void sim_shutdown(void)
{
    sim_stream *all[DEVICE_MAX_DEVICES];
    pthread_mutex_lock(&sim_lock);
    for (int d = 0; d < DEVICE_MAX_DEVICES; d++) {
        all[d] = sim_devices[d].streams;
        sim_devices[d].streams = NULL;
        sim_devices[d].default_stream = NULL;
        if (sim_devices[d].in_use)
            TD_LOG_WARN("sim device %d shut down with %" PRIu64 " bytes still allocated", d, sim_devices[d].in_use);
        sim_devices[d].in_use = 0;
    }
    atomic_store_explicit(&sim_count_loaded, -1, memory_order_release);
    pthread_mutex_unlock(&sim_lock);
    for (int d = 0; d < DEVICE_MAX_DEVICES; d++) {
        sim_stream *s = all[d];
        while (s) {
            sim_stream *next = s->next_in_device;
            sim_stream_stop(s);
            s = next;
        }
    }
    /* No stream thread is left (shutdown runs once nothing is live): a child forked from now on
     * may start sim itself. */
    if (atomic_load(&sim_threads_running) == 0)
        device_mark_initialized(TD_DEVICE_SIM, false);
}

/* ---- memory --------------------------------------------------------------------------------- */

/* Each device allocation is its own memfd mapping, so another process can map it (mem_ipc_handle):
 * the header at its start says what it is. */
typedef struct sim_block_header {
    uint64_t magic;
    uint64_t accounted; /* bytes counted against the budget */
    int dev;
    int fd;             /* the memfd, kept so a handle can name it */
    uint64_t map_bytes; /* the mapping: header + accounted */
    uint64_t file_dev, file_ino;
} sim_block_header;

/* A shared mapping of a new memfd of nbytes (untouched pages cost nothing). */
static td_status sim_map_new(size_t nbytes, int *fd_out, void **out)
{
    int fd = (int)syscall(SYS_memfd_create, "tdist-sim-memory", 1u /* MFD_CLOEXEC */);
    if (fd < 0)
        return error_errno(errno == EMFILE || errno == ENFILE ? TD_ERR_NOMEM : TD_ERR_IO,
                           "simulated device memory: memfd_create");
    if (ftruncate(fd, (off_t)nbytes) != 0) {
        td_status st = error_errno(TD_ERR_NOMEM, "simulated device memory: ftruncate to %zu bytes", nbytes);
        close(fd);
        return st;
    }
    void *p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        td_status st = error_errno(TD_ERR_NOMEM, "simulated device memory: mmap of %zu bytes", nbytes);
        close(fd);
        return st;
    }
    *fd_out = fd;
    *out = p;
    return TD_OK;
}

static td_status sim_device_malloc(int dev, size_t nbytes, void **out)
{
    *out = NULL;
    TD_TRY(sim_check_dev(dev));
    if (nbytes == 0)
        return TD_OK;
    uint64_t accounted = ((uint64_t)nbytes + SIM_ALIGN - 1) / SIM_ALIGN * SIM_ALIGN;
    pthread_mutex_lock(&sim_lock);
    uint64_t budget = sim_budget, used = sim_devices[dev].in_use;
    bool fits = accounted <= budget && used <= budget - accounted;
    if (fits)
        sim_devices[dev].in_use += accounted;
    pthread_mutex_unlock(&sim_lock);
    if (!fits) {
        char want[32], total[32], in_use[32];
        sim_format_size(nbytes, want, sizeof want);
        sim_format_size(budget, total, sizeof total);
        sim_format_size(used, in_use, sizeof in_use);
        return error_fmt(TD_ERR_NOMEM,
                         "Simulated device sim:%d out of memory. Tried to allocate %s (budget %s, %s in use)", dev,
                         want, total, in_use);
    }
    /* The pages are not touched (beyond the header's): untouched pages cost nothing. */
    void *block = NULL;
    int fd = -1;
    td_status st = sim_map_new(SIM_HEADER + (size_t)accounted, &fd, &block);
    if (st != TD_OK) {
        pthread_mutex_lock(&sim_lock);
        sim_devices[dev].in_use -= accounted;
        pthread_mutex_unlock(&sim_lock);
        return st;
    }
    sim_block_header *h = block;
    h->magic = SIM_BLOCK_MAGIC;
    h->accounted = accounted;
    h->dev = dev;
    h->fd = fd;
    h->map_bytes = SIM_HEADER + accounted;
    struct stat fst;
    if (fstat(fd, &fst) == 0) {
        h->file_dev = (uint64_t)fst.st_dev;
        h->file_ino = (uint64_t)fst.st_ino;
    }
    *out = (unsigned char *)block + SIM_HEADER;
    return TD_OK;
}

static void sim_device_free(int dev, void *ptr)
{
    if (!ptr)
        return;
    sim_block_header *h = (sim_block_header *)((unsigned char *)ptr - SIM_HEADER);
    if (h->magic != SIM_BLOCK_MAGIC || h->dev != dev) {
        TD_LOG_ERROR("sim device_free(%d, %p): not a block of this device", dev, ptr);
        return;
    }
    /* As cudaFree, which waits for the device: work still queued (a copy into this block from
     * another device's stream, say) must not land in freed memory. The allocator frees segments
     * only at empty_cache, an out-of-memory retry and shutdown, so waiting for every simulated
     * device here costs nothing on the hot path. */
    int total = sim_count();
    for (int d = 0; d < total; d++)
        (void)sim_device_synchronize(d);
    h->magic = 0;
    pthread_mutex_lock(&sim_lock);
    if (dev >= 0 && dev < DEVICE_MAX_DEVICES && sim_devices[dev].in_use >= h->accounted)
        sim_devices[dev].in_use -= h->accounted;
    pthread_mutex_unlock(&sim_lock);
    int fd = h->fd;
    munmap(h, (size_t)h->map_bytes);
    close(fd);
}

/* The handle names the block's memfd as /proc/<pid>/fd/<fd>, with its identity and size. */
typedef struct sim_mem_wire {
    uint32_t magic;
    int32_t pid;
    int32_t fd;
    int32_t dev;
    uint64_t file_dev, file_ino, map_bytes;
} sim_mem_wire;
_Static_assert(sizeof(sim_mem_wire) <= sizeof(((device_mem_ipc_handle *)0)->bytes), "sim_mem_wire too large");

static td_status sim_mem_ipc_handle(int dev, void *base, device_mem_ipc_handle *out)
{
    sim_block_header *h = base ? (sim_block_header *)((unsigned char *)base - SIM_HEADER) : NULL;
    if (!h || h->magic != SIM_BLOCK_MAGIC || h->dev != dev || h->fd < 0)
        return error_fmt(TD_ERR_INVALID, "sim error: %p is not a memory block of sim:%d", base, dev);
    sim_mem_wire w = {.magic = (uint32_t)SIM_BLOCK_MAGIC, .pid = (int32_t)getpid(), .fd = h->fd, .dev = dev,
                      .file_dev = h->file_dev, .file_ino = h->file_ino, .map_bytes = h->map_bytes};
    memset(out, 0, sizeof *out);
    memcpy(out->bytes, &w, sizeof w);
    return TD_OK;
}

static td_status sim_mem_open_ipc(int dev, const device_mem_ipc_handle *handle, size_t nbytes, void **base)
{
    *base = NULL;
    TD_TRY(sim_check_dev(dev));
    sim_mem_wire w;
    memcpy(&w, handle->bytes, sizeof w);
    if (w.magic != (uint32_t)SIM_BLOCK_MAGIC || w.pid <= 0 || w.fd < 0 || w.map_bytes != SIM_HEADER + (uint64_t)nbytes)
        return error_fmt(TD_ERR_INVALID, "sim error: invalid memory IPC handle");
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)w.pid, (int)w.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return error_errno(TD_ERR_INVALID, "sim error: opening the device memory of process %d (%s)", (int)w.pid, path);
    struct stat fst;
    if (fstat(fd, &fst) != 0 || (uint64_t)fst.st_dev != w.file_dev || (uint64_t)fst.st_ino != w.file_ino ||
        (uint64_t)fst.st_size < w.map_bytes) {
        close(fd);
        return error_fmt(TD_ERR_INVALID, "sim error: the memory IPC handle of process %d no longer names its block",
                         (int)w.pid);
    }
    void *p = mmap(NULL, (size_t)w.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd); /* the mapping keeps the memory */
    if (p == MAP_FAILED)
        return error_errno(TD_ERR_NOMEM, "sim error: mapping %llu bytes of process %d's device memory",
                           (unsigned long long)w.map_bytes, (int)w.pid);
    *base = (unsigned char *)p + SIM_HEADER;
    return TD_OK;
}

static void sim_mem_close_ipc(int dev, void *base, size_t nbytes)
{
    (void)dev;
    if (base)
        munmap((unsigned char *)base - SIM_HEADER, SIM_HEADER + nbytes);
}

static td_status sim_host_malloc(size_t nbytes, void **out)
{
    *out = NULL;
    if (nbytes == 0)
        return TD_OK;
    return alloc_try_aligned(SIM_ALIGN, nbytes, "pinned host memory", out);
}

static void sim_host_free(void *ptr) { free(ptr); }

/* ---- streams -------------------------------------------------------------------------------- */

static td_status sim_stream_create(int dev, int priority, void **out)
{
    TD_TRY(sim_check_dev(dev));
    if (priority > 0 || priority < -1)
        priority = priority > 0 ? 0 : -1; /* clamped into (0, -1), as CUDA does */
    sim_stream *s = NULL;
    TD_TRY(sim_stream_new(dev, priority, false, &s));
    pthread_mutex_lock(&sim_lock);
    s->next_in_device = sim_devices[dev].streams;
    sim_devices[dev].streams = s;
    pthread_mutex_unlock(&sim_lock);
    *out = s;
    return TD_OK;
}

static void sim_stream_destroy(int dev, void *native)
{
    sim_stream *s = native;
    if (!s || s->is_default)
        return;
    (void)dev;
    pthread_mutex_lock(&sim_lock);
    int d = s->dev;
    for (sim_stream **p = &sim_devices[d].streams; *p; p = &(*p)->next_in_device) {
        if (*p == s) {
            *p = s->next_in_device;
            break;
        }
    }
    pthread_mutex_unlock(&sim_lock);
    sim_stream_stop(s);
}

static td_status sim_stream_priority_range(int dev, int *least, int *greatest)
{
    TD_TRY(sim_check_dev(dev));
    *least = 0;
    *greatest = -1;
    return TD_OK;
}

static int sim_stream_query(int dev, void *native)
{
    sim_stream *s = NULL;
    td_status st = sim_stream_of(dev, native, &s);
    if (st != TD_OK)
        return st;
    pthread_mutex_lock(&s->lock);
    int done = s->completed == s->enqueued;
    pthread_mutex_unlock(&s->lock);
    return done;
}

static td_status sim_stream_synchronize(int dev, void *native)
{
    sim_stream *s = NULL;
    TD_TRY(sim_stream_of(dev, native, &s));
    pthread_mutex_lock(&s->lock);
    while (s->completed < s->enqueued)
        pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
    return TD_OK;
}

static td_status sim_stream_wait_event(int dev, void *native, void *event)
{
    sim_event *e = event;
    if (!e)
        return error_fmt(TD_ERR_INVALID, "sim error: stream_wait_event on a NULL event");
    sim_stream *s = NULL;
    TD_TRY(sim_stream_of(dev, native, &s));
    if (e->page) {
        uint64_t target = atomic_load(&e->page->recorded);
        if (sim_ipc_reached(e->page, target))
            return TD_OK;
        sim_item *item = sim_item_new(SIM_OP_WAIT_IPC);
        ref_inc(&e->refs);
        item->u.wait_ipc.event = e;
        item->u.wait_ipc.target = target;
        sim_enqueue_on(s, item);
        return TD_OK;
    }
    uint64_t seq = 0;
    sim_stream *target = sim_event_capture(e, &seq);
    if (!target)
        return TD_OK; /* never recorded: nothing to wait for, as CUDA */
    sim_item *item = sim_item_new(SIM_OP_WAIT);
    item->u.wait.stream = target;
    item->u.wait.seq = seq;
    sim_enqueue_on(s, item);
    return TD_OK;
}

/* ---- events --------------------------------------------------------------------------------- */

static td_status sim_event_create(int dev, unsigned flags, void **out)
{
    TD_TRY(sim_check_dev(dev));
    sim_event *e = TD_NEW(sim_event);
    ref_init(&e->refs);
    e->dev = dev;
    e->flags = flags;
    e->page_fd = -1;
    thread_mutex_init(&e->lock);
    if (flags & TD_EVENT_INTERPROCESS) {
        td_status st = sim_ipc_create(e);
        if (st != TD_OK) {
            sim_event_release(e);
            return st;
        }
    }
    *out = e;
    return TD_OK;
}

static void sim_event_destroy(int dev, void *event)
{
    (void)dev;
    sim_event_release(event);
}

static td_status sim_event_record(int dev, void *event, void *native)
{
    sim_event *e = event;
    if (!e)
        return error_fmt(TD_ERR_INVALID, "sim error: event_record on a NULL event");
    sim_stream *s = NULL;
    TD_TRY(sim_stream_of(dev, native, &s));
    sim_item *item = sim_item_new(SIM_OP_RECORD);
    ref_inc(&e->refs);
    item->u.record.event = e;
    item->u.record.stream = s;
    ref_inc(&s->refs);
    if (e->page) /* numbered before it is queued, so its completion can never precede its number */
        item->u.record.ipc_target = atomic_fetch_add(&e->page->recorded, 1) + 1;
    /* event -> stream: the capture is in place before the stream's thread can reach the item. */
    pthread_mutex_lock(&e->lock);
    sim_stream *old = e->stream;
    pthread_mutex_lock(&s->lock);
    e->seq = sim_enqueue_locked(s, item);
    pthread_mutex_unlock(&s->lock);
    e->stream = s;
    e->stamped = false;
    pthread_mutex_unlock(&e->lock);
    sim_stream_release(old);
    return TD_OK;
}

static int sim_event_query(int dev, void *event)
{
    (void)dev;
    if (!event)
        return error_fmt(TD_ERR_INVALID, "sim error: event_query on a NULL event");
    sim_event *ev = event;
    if (ev->page)
        return sim_ipc_reached(ev->page, atomic_load(&ev->page->recorded)) ? 1 : 0;
    uint64_t seq = 0;
    sim_stream *s = sim_event_capture(event, &seq);
    if (!s)
        return 1;
    int done = sim_stream_reached(s, seq);
    sim_stream_release(s);
    return done;
}

static td_status sim_event_synchronize(int dev, void *event)
{
    (void)dev;
    if (!event)
        return error_fmt(TD_ERR_INVALID, "sim error: event_synchronize on a NULL event");
    sim_event *ev = event;
    if (ev->page) {
        sim_ipc_wait(ev->page, atomic_load(&ev->page->recorded));
        return TD_OK;
    }
    uint64_t seq = 0;
    sim_stream *s = sim_event_capture(event, &seq);
    if (!s)
        return TD_OK;
    sim_stream_wait_seq(s, seq);
    sim_stream_release(s);
    return TD_OK;
}

static td_status sim_event_elapsed_ms(int dev, void *start, void *end, float *ms)
{
    (void)dev;
    sim_event *a = start, *b = end;
    if (!a || !b)
        return error_fmt(TD_ERR_INVALID, "Both events must be recorded before calculating elapsed time.");
    uint64_t seq_a = 0, seq_b = 0;
    sim_stream *sa = sim_event_capture(a, &seq_a), *sb = sim_event_capture(b, &seq_b);
    td_status st = TD_OK;
    if (!sa || !sb) {
        st = error_fmt(TD_ERR_INVALID, "Both events must be recorded before calculating elapsed time.");
    } else if (!sim_event_timed(a) || !sim_event_timed(b)) {
        st = error_fmt(TD_ERR_INVALID, "Both events must be created with argument 'enable_timing=True'.");
    } else if (a->dev != b->dev || sa->dev != sb->dev) {
        st = error_fmt(TD_ERR_INVALID,
                       "sim error: the events were recorded on different devices (sim:%d and sim:%d)", sa->dev,
                       sb->dev);
    } else if (!sim_stream_reached(sa, seq_a) || !sim_stream_reached(sb, seq_b)) {
        st = error_fmt(TD_ERR_INVALID, "Both events must be completed before calculating elapsed time.");
    } else {
        pthread_mutex_lock(&a->lock);
        bool ok_a = a->stamped && a->stream == sa && a->seq == seq_a;
        int64_t t_a = a->stamp_ns;
        pthread_mutex_unlock(&a->lock);
        pthread_mutex_lock(&b->lock);
        bool ok_b = b->stamped && b->stream == sb && b->seq == seq_b;
        int64_t t_b = b->stamp_ns;
        pthread_mutex_unlock(&b->lock);
        if (!ok_a || !ok_b)
            st = error_fmt(TD_ERR_INVALID, "Both events must be completed before calculating elapsed time.");
        else
            *ms = (float)((double)(t_b - t_a) / 1e6);
    }
    sim_stream_release(sa);
    sim_stream_release(sb);
    return st;
}

/* The handle names the exporter's memfd as /proc/<pid>/fd/<fd> (any process of the same user can
 * open that while the exporter holds the event, as a CUDA IPC handle needs its exporter alive),
 * with the file's identity and the page's nonce, so a reused fd number is refused. */
typedef struct sim_ipc_wire {
    uint32_t magic;
    int32_t pid;
    int32_t fd;
    int32_t dev;
    uint64_t file_dev, file_ino, nonce;
} sim_ipc_wire;
_Static_assert(sizeof(sim_ipc_wire) <= sizeof(((td_event_ipc_handle *)0)->bytes), "sim_ipc_wire too large");

static td_status sim_event_ipc_handle(int dev, void *event, td_event_ipc_handle *out)
{
    (void)dev;
    sim_event *e = event;
    if (!e || !e->page)
        return error_fmt(TD_ERR_INVALID, "sim error: the event was not created with TD_EVENT_INTERPROCESS");
    sim_ipc_wire w = {.magic = SIM_IPC_MAGIC, .pid = (int32_t)getpid(), .fd = e->page_fd, .dev = e->dev,
                      .file_dev = e->page_dev, .file_ino = e->page_ino, .nonce = e->page->nonce};
    memset(out, 0, sizeof *out);
    memcpy(out->bytes, &w, sizeof w);
    return TD_OK;
}

static td_status sim_event_open_ipc(int dev, const td_event_ipc_handle *handle, void **out)
{
    *out = NULL;
    TD_TRY(sim_check_dev(dev));
    sim_ipc_wire w;
    memcpy(&w, handle->bytes, sizeof w);
    if (w.magic != SIM_IPC_MAGIC || w.pid <= 0 || w.fd < 0)
        return error_fmt(TD_ERR_INVALID, "sim error: invalid interprocess event handle");
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)w.pid, (int)w.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return error_errno(errno == ENOENT ? TD_ERR_INVALID : TD_ERR_IO,
                           "sim error: opening the interprocess event of process %d (%s): is the exporting process "
                           "still holding the event?",
                           (int)w.pid, path);
    sim_event *e = NULL;
    td_status st = sim_event_create(dev, TD_EVENT_DEFAULT, (void **)&e);
    if (st != TD_OK) {
        close(fd);
        return st;
    }
    e->flags = TD_EVENT_INTERPROCESS;
    st = sim_ipc_map(e, fd, false);
    if (st != TD_OK) {
        close(fd);
        sim_event_release(e);
        return st;
    }
    if (e->page_dev != w.file_dev || e->page_ino != w.file_ino || e->page->magic != SIM_IPC_MAGIC ||
        e->page->nonce != w.nonce) {
        sim_event_release(e);
        return error_fmt(TD_ERR_INVALID, "sim error: the interprocess event handle of process %d no longer names "
                                         "its event (it was destroyed)",
                         (int)w.pid);
    }
    *out = e;
    return TD_OK;
}

/* ---- work ----------------------------------------------------------------------------------- */

static td_status sim_memcpy_async(int dev, void *dst, const void *src, size_t nbytes, device_copy_kind kind,
                                  void *stream)
{
    if (kind != DEVICE_COPY_H2D && kind != DEVICE_COPY_D2H && kind != DEVICE_COPY_D2D)
        return error_fmt(TD_ERR_INVALID, "sim error: invalid memcpy kind %d", (int)kind);
    if (nbytes && (!dst || !src))
        return error_fmt(TD_ERR_INVALID, "sim error: memcpy of %zu bytes with a NULL pointer", nbytes);
    sim_item *item = sim_item_new(SIM_OP_COPY);
    item->u.copy.dst = dst;
    item->u.copy.src = src;
    item->u.copy.nbytes = nbytes;
    return sim_enqueue(dev, stream, item);
}

static td_status sim_memcpy_peer_async(int dst_dev, void *dst, int src_dev, const void *src, size_t nbytes,
                                       void *stream)
{
    TD_TRY(sim_check_dev(dst_dev));
    TD_TRY(sim_check_dev(src_dev));
    return sim_memcpy_async(src_dev, dst, src, nbytes, DEVICE_COPY_D2D, stream);
}

static td_status sim_check_strided(const device_strided *t, const char *what)
{
    if (t->ndim < 0 || t->ndim > DEVICE_MAX_KERNEL_DIMS)
        return error_fmt(TD_ERR_INVALID, "sim error: strided_copy %s has %d dimensions", what, t->ndim);
    for (int d = 0; d < t->ndim; d++)
        if (t->sizes[d] < 0)
            return error_fmt(TD_ERR_INVALID, "sim error: strided_copy %s has a negative size", what);
    return TD_OK;
}

static td_status sim_strided_copy(int dev, const device_strided *dst, const device_strided *src, size_t elem_size,
                                  void *stream)
{
    if (elem_size != 1 && elem_size != 2 && elem_size != 4 && elem_size != 8 && elem_size != 16)
        return error_fmt(TD_ERR_INVALID, "sim error: strided_copy of %zu-byte elements", elem_size);
    TD_TRY(sim_check_strided(dst, "destination"));
    TD_TRY(sim_check_strided(src, "source"));
    if (sim_numel(dst) != sim_numel(src))
        return error_fmt(TD_ERR_INVALID, "sim error: strided_copy of %" PRId64 " elements into %" PRId64,
                         sim_numel(src), sim_numel(dst));
    sim_item *item = sim_item_new(SIM_OP_STRIDED);
    item->u.strided.dst = *dst;
    item->u.strided.src = *src;
    item->u.strided.elem_size = elem_size;
    return sim_enqueue(dev, stream, item);
}

static td_status sim_fill(int dev, void *dst, size_t count, const void *value, size_t elem_size, void *stream)
{
    if (elem_size == 0 || elem_size > 16)
        return error_fmt(TD_ERR_INVALID, "sim error: fill with %zu-byte elements", elem_size);
    sim_item *item = sim_item_new(SIM_OP_FILL);
    item->u.fill.dst = dst;
    item->u.fill.count = count;
    item->u.fill.elem_size = elem_size;
    memcpy(item->u.fill.value, value, elem_size);
    return sim_enqueue(dev, stream, item);
}

static td_status sim_add(int dev, void *dst, const void *a, const void *b, size_t count, td_dtype dtype,
                         void *stream)
{
    td_reduce_fn kernel = td_dtype_is_valid((int)dtype) ? td_reduce_kernel(TD_SUM, dtype) : NULL;
    if (!kernel)
        return error_fmt(TD_ERR_UNSUPPORTED, "sim error: no add kernel for dtype %d", (int)dtype);
    sim_item *item = sim_item_new(SIM_OP_ADD);
    item->u.add.dst = dst;
    item->u.add.a = a;
    item->u.add.b = b;
    item->u.add.count = count;
    item->u.add.kernel = kernel;
    return sim_enqueue(dev, stream, item);
}

static td_status sim_sleep(int dev, int64_t cycles, void *stream)
{
    sim_item *item = sim_item_new(SIM_OP_SLEEP);
    /* cycles at clock_rate_khz: ns = cycles * 1e6 / khz (1 ns per cycle at 1 GHz). */
    item->u.sleep.ns = cycles > 0 ? (int64_t)((double)cycles * 1e6 / SIM_CLOCK_KHZ) : 0;
    return sim_enqueue(dev, stream, item);
}

static td_status sim_random(int dev, void *dst, size_t count, td_dtype dtype, int dist, double a, double b,
                            uint64_t seed, uint64_t offset, void *stream)
{
    if (dtype != TD_FLOAT16 && dtype != TD_BFLOAT16 && dtype != TD_FLOAT32 && dtype != TD_FLOAT64)
        return error_fmt(TD_ERR_UNSUPPORTED, "sim error: no random kernel for dtype %d", (int)dtype);
    if (dist != PHILOX_DIST_UNIFORM && dist != PHILOX_DIST_NORMAL)
        return error_fmt(TD_ERR_INVALID, "sim error: unknown random distribution %d", dist);
    if (count == 0)
        return TD_OK;
    sim_item *item = sim_item_new(SIM_OP_RANDOM);
    item->u.random.dst = dst;
    item->u.random.count = count;
    item->u.random.dtype = dtype;
    item->u.random.dist = dist;
    item->u.random.a = a;
    item->u.random.b = b;
    item->u.random.seed = seed;
    item->u.random.offset = offset;
    return sim_enqueue(dev, stream, item);
}

int64_t device_sim_thread_count(void) { return atomic_load(&sim_threads_running); }

const device_impl device_sim_impl = {
    .name = "sim",
    .type = TD_DEVICE_SIM,
    .count = sim_count,
    .properties = sim_properties,
    .mem_get_info = sim_mem_get_info,
    .device_synchronize = sim_device_synchronize,
    .shutdown = sim_shutdown,
    .device_malloc = sim_device_malloc,
    .device_free = sim_device_free,
    .host_malloc = sim_host_malloc,
    .host_free = sim_host_free,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .stream_priority_range = sim_stream_priority_range,
    .stream_query = sim_stream_query,
    .stream_synchronize = sim_stream_synchronize,
    .stream_wait_event = sim_stream_wait_event,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .event_synchronize = sim_event_synchronize,
    .event_elapsed_ms = sim_event_elapsed_ms,
    .event_ipc_handle = sim_event_ipc_handle,
    .event_open_ipc = sim_event_open_ipc,
    .mem_ipc_handle = sim_mem_ipc_handle,
    .mem_open_ipc = sim_mem_open_ipc,
    .mem_close_ipc = sim_mem_close_ipc,
    .memcpy_async = sim_memcpy_async,
    .memcpy_peer_async = sim_memcpy_peer_async,
    .strided_copy = sim_strided_copy,
    .fill = sim_fill,
    .add = sim_add,
    .sleep = sim_sleep,
    .random = sim_random,
};
