/* Internal: the process-group front end's structures, shared by the files of src/pg.
 *
 *   pg.c           groups: create, new_group, destroy, queries; the one hand-off path (pg_issue,
 *                  the worker, pg_submit) and completion (td_work_done)
 *   collectives.c  argument checks and normalization of every collective and p2p call; td_pg_supports
 *   object.c       object collectives over the td_value codec
 *   barrier.c      monitored_barrier over the group's store
 *   default_group.c  the default group, td_new_group and td_pg_destroy (on top of pg.c)
 *   debug.c        (leaf) op names, debug levels, collective fingerprints and their comparison
 *   registry.c     (leaf) backends by name, td_coll_kind_name, the support checks
 *   future.c, executor.c  futures and the thread their callbacks run on
 *
 * Files call downwards only: default_group.c, collectives.c, object.c, barrier.c -> pg.c ->
 * debug.c, registry.c, future.c -> executor.c.
 *
 * An operation is a td_work: the backend's td_coll plus what the front end needs around it (the
 * future, temporaries to copy back, the result value, the fingerprint). pg_issue hands each to the
 * backend through pg_submit, on the caller's thread when the group is idle and the backend allows
 * it, else through the queue the group's worker thread drains in issue order; in flight they sit
 * on a list that the worker watches for deadlines and that destroy waits to drain. */
#ifndef TDIST_PG_PG_IMPL_H
#define TDIST_PG_PG_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <tdist/backend.h>
#include <tdist/future.h>
#include <tdist/pg.h>
#include <tdist/store.h>

#include "base/fork.h"
#include "base/vec.h"

/* The front end's operation types, as c10d's OpType (for messages and fingerprints). */
typedef enum pg_op {
    PG_OP_BROADCAST = 0,
    PG_OP_ALLREDUCE,
    PG_OP_ALLREDUCE_COALESCED,
    PG_OP_REDUCE,
    PG_OP_ALLGATHER,
    PG_OP_ALLGATHER_BASE,
    PG_OP_ALLGATHER_COALESCED,
    PG_OP_GATHER,
    PG_OP_SCATTER,
    PG_OP_REDUCE_SCATTER,
    PG_OP_REDUCE_SCATTER_BASE,
    PG_OP_ALLTOALL,
    PG_OP_ALLTOALL_BASE,
    PG_OP_BARRIER,
    PG_OP_SEND,
    PG_OP_RECV,
    PG_OP_RECVANYSOURCE,
    PG_OP_FINGERPRINT, /* the DETAIL check's own all_gather */
    PG_OP_COUNT
} pg_op;

typedef enum pg_debug_level { PG_DEBUG_OFF = 0, PG_DEBUG_INFO = 1, PG_DEBUG_DETAIL = 2 } pg_debug_level;

/* What every rank must agree on for one collective (DETAIL), as fixed-size int64 words so that it
 * travels as one all_gather of TD_INT64. ndim -1: shapes are not compared (all_to_all). */
typedef struct pg_fingerprint {
    int64_t seq;
    int64_t op;
    int64_t dtype;
    int64_t root;
    int64_t reduce_op;
    int64_t ntensors;
    int64_t shapes_hash; /* of every tensor's shape, for list forms */
    int64_t ndim;
    int64_t shape[TD_MAX_DIMS];
} pg_fingerprint;
#define PG_FP_WORDS (sizeof(pg_fingerprint) / sizeof(int64_t))

typedef struct pg_copy {
    td_tensor *dst; /* NULL: src is only kept alive */
    td_tensor *src;
} pg_copy;

/* Where a blocking call handed over on its own thread gets its result instead of a future
 * (pg_issue): on that thread's stack. */
typedef struct pg_sync {
    td_status status;
    char *message;         /* malloc'd, when status is not TD_OK */
    bool (*drive)(void);   /* td_work_set_driver's, for the caller's wait */
    bool waiting;          /* the caller sleeps on pg->cv (under pg->mu) */
    _Atomic bool done;
} pg_sync;

struct td_work {
    /* Per operation: every field set by pg_work_new / pg_work_init_local. */
    td_pg *pg;
    td_future *future;
    td_coll coll;
    td_op reduce_op; /* the caller's op: coll.op has PREMUL_SUM and AVG resolved into SUM */
    pg_op op;
    uint64_t seq; /* the group's operation number, for messages and fingerprints */
    int64_t issue_ns;
    int64_t numel_in, numel_out;
    bool is_p2p;
    bool nonfatal;     /* a failure does not fail the group (front-end checks) */
    bool value_sender; /* the result is the sender's rank (receives) */
    bool is_async;     /* the caller took a work handle (set by the call that builds it) */
    bool has_fp;       /* fp is filled (else only fp.ndim is meaningful: -1) */
    bool on_stack;     /* its caller's (pg_work_init_local): never pooled */
    td_value *result;       /* the value on success (a list of the output tensors) */
    td_work *next;          /* queue */
    td_work *iprev, *inext; /* in-flight list */
    pg_sync *sync;          /* a blocking call handed over on its caller's thread: no future */
    /* Not reset: fp is filled by pg_fingerprint_fill when has_fp; the arrays and the copy list
     * keep their storage for the next operation. */
    pg_fingerprint fp; /* also the shape traces report */
    /* storage for the coll's block arrays (pg_work_blocks) */
    const void **in_blocks;
    size_t *in_counts;
    void **out_blocks;
    size_t *out_counts;
    TD_VEC(pg_copy) copies; /* on success, dst := src, in order; every src is released at the end */
};

struct td_pg {
    td_fork_guard guard; /* its worker thread does not survive fork */
    char *name;
    char *backend_name;
    const td_backend_ops *ops;
    void *state;
    unsigned caps;    /* TD_BACKEND_CAP_* for this group (the backend's create may change them) */
    bool member;
    int rank, size;   /* in the group; -1 for a non-member */
    int global_rank;  /* this process's rank in the root group */
    int *global_ranks; /* group rank -> global rank, nranks entries */
    int nranks;
    int64_t timeout_ms;
    /* pg_check_supported's passes: bit op of [kind][dtype] once (kind, dtype, op) passed (it is
     * asked on every call; the answers do not change for a group). */
    _Atomic uint32_t supported[TD_COLL_KIND_COUNT][TD_DTYPE_COUNT];
    pg_debug_level debug;
    td_store *base_store;  /* the root's store, under which every group of the root has its prefix */
    td_store *store;       /* base_store prefixed with "<name>/" */
    bool is_root;          /* made by td_pg_create: its subgroups are named "1", "2", ... */
    bool local_store;      /* base_store is this process's only (TD_BACKEND_CAP_RUNTIME_WORLD) */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t worker;
    bool worker_started;
    bool stop;
    td_work *qhead, *qtail;
    td_work *inflight;
    /* PG_GATE_* bits: whether a thread (the worker or a caller) is handing an operation to the
     * backend (BUSY, which keeps everyone else off it), whether works are queued, whether the group
     * failed or is being destroyed; in one word, so that a blocking call on an idle group takes the
     * backend with one compare-and-swap instead of the lock. */
    _Atomic unsigned gate;
    td_status failed;     /* TD_OK while healthy */
    char *failed_msg;
    bool backend_aborted;
    /* Numbers given as operations are handed over, by the BUSY holder (pg_submit): */
    uint64_t last_op_seq;      /* collectives (a work's seq) */
    uint64_t last_p2p_seq;     /* sends and receives */
    uint64_t last_backend_seq; /* collectives as the backend sees them (td_coll.seq: with DETAIL's
                                  fingerprint exchanges) */
    uint64_t last_backend_p2p_seq;
    uint64_t child_count;      /* subgroups made from this group, for their names */
    uint64_t monitored_seq;    /* monitored_barrier calls (barrier.c) */
    /* Set under mu; read without it on the hot path through pg_traced(). */
    void (*trace_fn)(const td_pg_trace_event *event, void *arg);
    void *trace_arg;
    td_work *free_works; /* recycled works (pg.c), under mu */
    int nfree_works;
    _Atomic(td_work *) spare_work; /* one more, taken and given back without the lock */
};

/* pg->gate. BUSY is taken by compare-and-swap (pg_claim) and dropped by its holder (pg_release);
 * QUEUED and CLOSED change only under pg->mu, with qhead and with failed / stop. Whoever drops
 * BUSY while QUEUED or CLOSED is set wakes pg->cv (the worker, or destroy, may wait for it). */
enum { PG_GATE_BUSY = 1u, PG_GATE_QUEUED = 2u, PG_GATE_CLOSED = 4u };

/* Takes BUSY unless it, or any bit of `unless`, is set. */
static inline bool pg_claim(td_pg *pg, unsigned unless)
{
    unsigned g = atomic_load_explicit(&pg->gate, memory_order_relaxed);
    do {
        if (g & (unless | PG_GATE_BUSY))
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&pg->gate, &g, g | PG_GATE_BUSY, memory_order_acquire,
                                                    memory_order_relaxed));
    return true;
}

/* Drops BUSY; returns the bits as they were. */
static inline unsigned pg_release(td_pg *pg)
{
    return atomic_fetch_and_explicit(&pg->gate, ~(unsigned)PG_GATE_BUSY, memory_order_acq_rel);
}

/* Drops BUSY only if neither QUEUED nor CLOSED is set, in one step: false, keeping BUSY, when
 * someone may wait for it (the holder then drops it under pg->mu and wakes pg->cv). */
static inline bool pg_release_idle(td_pg *pg)
{
    unsigned g = PG_GATE_BUSY;
    return atomic_compare_exchange_strong_explicit(&pg->gate, &g, 0u, memory_order_acq_rel, memory_order_relaxed);
}

static inline bool pg_busy(const td_pg *pg)
{
    return atomic_load_explicit(&pg->gate, memory_order_acquire) & PG_GATE_BUSY;
}

/* Whether a trace callback is set, read without the group's lock: an operation issued while
 * td_pg_set_trace_callback runs may or may not be traced, nothing worse. */
static inline bool pg_traced(const td_pg *pg) { return __atomic_load_n(&pg->trace_fn, __ATOMIC_RELAXED) != NULL; }

/* ---- pg.c ---------------------------------------------------------------------------------- */

/* TD_OK when g, the group pg_or_default gave (NULL: none), can run opname now; else the error (not
 * initialized, not a member, a forked copy). The error's way is pg_not_usable. */
td_status pg_not_usable(td_pg *g, const char *opname);
static inline td_status pg_check_usable(td_pg *g, const char *opname)
{
    if (__builtin_expect(g && g->member && fork_guard_ok(&g->guard), 1))
        return TD_OK;
    return pg_not_usable(g, opname);
}
/* The default group's world, what torch.distributed's _World holds: the default group and the
 * groups td_new_group made from it (destroyed with it, newest first). The process has one
 * (default_group.c, under its lock); a rank thread of the threaded test harness has its own
 * (pg_thread_world_begin), which only that thread touches, as PyTorch's MultiThreadedTestCase
 * installs a ThreadLocalWorld. */
typedef struct pg_world {
    td_pg *default_pg;
    TD_VEC(td_pg *) groups;
} pg_world;
/* The calling thread's own world, NULL for every thread but a harness rank thread. */
pg_world *pg_thread_world(void);
void pg_set_thread_world(pg_world *world);
/* default_group.c: gives the calling thread a world of its own (the threaded harness, at the start
 * of a rank thread); _end destroys what is left in it (its default group and subgroups) and returns
 * the thread to the process's world. */
void pg_thread_world_begin(void);
void pg_thread_world_end(void);
/* The group a call names: NULL means the default group of the calling thread's world (NULL when
 * there is none), which default_group.c sets: the thread's own world's, else the process's. */
td_pg *pg_default_group(void);
/* Sets the process's default group (default_group.c; a thread's own world holds its own). */
void pg_set_default_group(td_pg *pg);
static inline td_pg *pg_or_default(td_pg *pg) { return pg ? pg : pg_default_group(); }
/* Both: *out gets the group. */
static inline td_status pg_resolve(td_pg *pg, const char *opname, td_pg **out)
{
    *out = pg_or_default(pg);
    return pg_check_usable(*out, opname);
}
td_work *pg_work_new(td_pg *pg, pg_op op, td_coll_kind kind, td_dtype dtype);
/* The caller's reduce op: the backend gets SUM for AVG (pg_work_finish divides) and PREMUL_SUM
 * (pg_submit scales the inputs first). */
static inline void pg_work_set_op(td_work *w, td_op op)
{
    w->reduce_op = op;
    w->coll.op = op.kind == TD_AVG || op.kind == TD_PREMUL_SUM ? TD_OP_SUM : op;
}
/* A work in storage of the caller's (its stack), for a blocking call that needs no block arrays:
 * handed over on the caller's thread it costs no pool traffic; otherwise pg_issue moves it to the
 * heap. */
td_work *pg_work_init_local(td_work *w, td_pg *pg, pg_op op, td_coll_kind kind, td_dtype dtype);
/* Gives back a work that will not run (its building or issuing failed). */
void pg_work_free(td_work *w);
/* Points the coll's in and/or out block arrays at the work's own (group size entries, zeroed). */
void pg_work_blocks(td_work *w, bool in, bool out);
/* After success, dst := src (td_tensor_copy). Takes src; dst is borrowed (the user's). */
void pg_work_copy_back(td_work *w, td_tensor *dst, td_tensor *src);
/* Keeps t (taken) alive until the work ends. */
void pg_work_keep(td_work *w, td_tensor *t);
/* Hands n works to the backend in order: each on this thread when the group is idle and its
 * capabilities allow, else through the worker's queue. With futs, futs[i] gets each one's future
 * (a new reference); without, waits for them all and returns the first failure. Takes the works,
 * even on failure. */
td_status pg_issue(td_pg *pg, td_work **ws, int n, td_future **futs);
/* With pg->mu held: the group fails (the first failure wins) and the worker aborts the backend. */
void pg_fail_locked(td_pg *pg, td_status status, const char *message);
/* Runs one operation on the backend from the thread holding BUSY, and waits for it (DETAIL's
 * exchange). */
td_status pg_run_internal(td_pg *pg, td_work *w);
/* Ends a work (any thread, exactly once): finishes AVG, copies back, fails the group if the error
 * is fatal, completes the future (or the caller's pg_sync) and frees the work (the caller does, for
 * a pg_sync). Takes message (may be NULL). */
void pg_work_finish(td_work *w, td_status status, int sender, char *message);
/* Destroys pg (member or not): fails what is pending, stops the worker and the backend, frees. */
void pg_destroy_now(td_pg *pg);

/* ---- future.c ------------------------------------------------------------------------------ */

/* A waiter that drives a backend yields between rounds for PG_DRIVE_SPIN_NS (an operation that
 * takes longer most likely waits for a slow peer), then sleeps between them, up to
 * PG_DRIVE_SLEEP_MAX_NS (woken at once through cv by a completion from another thread). */
#define PG_DRIVE_SPIN_NS (20 * 1000 * 1000)
#define PG_DRIVE_SLEEP_MAX_NS (200 * 1000)

/* With mu held (released around each drive() call and each yield): drives until done(arg), true;
 * false when drive() says it is not needed or the deadline passed. Waits on a future and blocking
 * calls handed over on their caller's thread both go through here. */
bool pg_drive_wait_locked(bool (*drive)(void), pthread_mutex_t *mu, pthread_cond_t *cv, bool (*done)(const void *),
                          const void *arg, int64_t deadline_ns);


/* ---- debug.c ------------------------------------------------------------------------------- */

/* "ALLREDUCE" (c10d's OpType name) and "all_reduce" (the API name, used in messages and traces). */
const char *pg_op_type_name(pg_op op);
const char *pg_op_api_name(pg_op op);
td_status pg_parse_debug_level(const char *value, pg_debug_level *out);
void pg_fingerprint_fill_now(td_work *w, td_tensor *const *tensors, int n, int root, int reduce_op, bool shapes);
/* The operation's fingerprint, where anything reads it: DETAIL's check, a trace callback (DETAIL
 * is fixed at the group's creation; a trace set later sees no shape, ndim -1). */
static inline void pg_fingerprint_fill(td_work *w, td_tensor *const *tensors, int n, int root, int reduce_op,
                                       bool shapes)
{
    if (__builtin_expect(w->pg->debug == PG_DEBUG_DETAIL || pg_traced(w->pg), 0))
        pg_fingerprint_fill_now(w, tensors, n, root, reduce_op, shapes);
    else
        w->fp.ndim = -1;
}
/* DETAIL's comparison of the fingerprints of the n ranks (from one all_gather): TD_OK, or
 * TD_ERR_INVALID with c10d's mismatch message. */
td_status pg_fingerprints_compare(const pg_fingerprint *fps, int n);

/* ---- registry.c ---------------------------------------------------------------------------- */

const td_backend_ops *pg_find_backend(const char *name);
/* "tcp, threaded" (malloc'd), for error messages. */
char *pg_backend_names(void);
/* The reduce op is defined for dtype (c10d's complex rule, then the kernels'); opname prefixes the
 * message. */
td_status pg_check_reduce(const char *opname, td_op op, td_dtype dtype);
/* The bit word of pg->supported that answers (kind, dtype, rk) at bit rk; NULL when out of range. */
static inline _Atomic uint32_t *pg_supported_bits(td_pg *pg, td_coll_kind kind, td_dtype dtype, td_reduce_op rk)
{
    bool ok = (unsigned)kind < TD_COLL_KIND_COUNT && (unsigned)dtype < TD_DTYPE_COUNT &&
              (unsigned)rk < TD_REDUCE_OP_COUNT;
    return ok ? &pg->supported[kind][dtype] : NULL;
}
/* pg_check_reduce for reducing kinds, then the backend's own supports(); a pass is remembered. */
td_status pg_check_supported_first(td_pg *pg, const char *opname, td_coll_kind kind, td_dtype dtype, td_op op);
/* The same, with the case of every call but the first inline: the remembered pass. */
static inline td_status pg_check_supported(td_pg *pg, const char *opname, td_coll_kind kind, td_dtype dtype,
                                           td_op op)
{
    td_reduce_op rk = td_coll_kind_reduces(kind) ? op.kind : TD_SUM;
    _Atomic uint32_t *seen = pg_supported_bits(pg, kind, dtype, rk);
    if (__builtin_expect(seen && (atomic_load_explicit(seen, memory_order_relaxed) >> rk & 1u), 1))
        return TD_OK;
    return pg_check_supported_first(pg, opname, kind, dtype, op);
}

#endif
