/* tdist/backend.h: writing a process-group backend.
 *
 * A process group is the front end (tdist/pg.h: argument checks, rank translation, packing of
 * non-contiguous and list arguments, debug-level checks, the worker that runs operations in issue
 * order, futures) plus a backend that moves the bytes. This header is the contract between them;
 * the built-in backends (tcp, threaded, shm, auto, mpi, nccl) implement it, and an application can
 * register its own with td_register_backend.
 *
 * The front end hands the backend one td_coll at a time, in issue order, through submit: from the
 * group's worker thread, or from the thread that issued the operation when the group is idle and
 * the backend declares it may (TD_BACKEND_CAP_CALLER_THREAD, TD_BACKEND_CAP_ASYNC_ON_CALLER).
 * Arguments are already checked and normalized: ranks are group ranks, every buffer is contiguous
 * memory of `dtype`, list forms are per-rank block arrays, coalesced forms are one flattened buffer,
 * and the reduce op is SUM, PROD, MIN, MAX or a bitwise op: the front end scales PREMUL_SUM's
 * inputs before and divides AVG's result after (td_reduce_premul, td_reduce_finish), so a backend
 * never sees either. The backend completes each operation exactly once with td_work_done, either
 * before submit returns (a blocking algorithm running on the submitting thread) or later from its
 * own progress thread (an asynchronous send, say). It must never call back into the front end's
 * collective API from submit.
 */
#ifndef TDIST_BACKEND_H
#define TDIST_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/collective.h>
#include <tdist/pg.h>
#include <tdist/status.h>
#include <tdist/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_coll {
    td_coll_kind kind;
    td_dtype dtype;
    td_op op;            /* reducing kinds (td_coll_kind_reduces): never AVG or PREMUL_SUM, which the
                            front end resolves into SUM */
    int root;            /* BROADCAST, REDUCE, GATHER, SCATTER */
    int peer;            /* SEND, RECV */
    int tag;             /* SEND, RECV */
    uint64_t seq;        /* per-group sequence number of collectives (p2p ops have their own) */
    int64_t deadline_ns; /* CLOCK_MONOTONIC; TD_DEADLINE_NONE (INT64_MAX) for none */
    td_coll_desc desc;   /* collectives: what every rank must agree on (set by the front end) */

    size_t count;        /* elements of in / out (or of each block for the even block kinds) */
    const void *in;
    void *out;
    /* Per-rank blocks (size entries each), for the kinds that say so; counts in elements. */
    const void *const *in_blocks;
    const size_t *in_counts;
    void *const *out_blocks;
    const size_t *out_counts;
} td_coll;

/* The completion handle of one submitted operation (owned by the front end). */
typedef struct td_work td_work;
/* Completes the operation: TD_OK, or an error with its message (printf-style; may be NULL when the
 * message is already in td_last_error()). For RECV, sender is the source rank (ignored otherwise). */
TD_API void td_work_done(td_work *w, td_status status, int sender, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* For a backend that at times has no thread of its own to advance its operations (mpi below
 * MPI_THREAD_SERIALIZED, where only the thread that initialized MPI may call it): whoever waits for
 * w's completion calls drive in a loop until w completes, instead of just blocking (and
 * td_future_is_completed calls it once). drive advances what it can from the calling thread and
 * returns at once; false when waiters need not call it (they then block). Call it from submit,
 * before anything can complete w. */
TD_API void td_work_set_driver(td_work *w, bool (*drive)(void));

/* What a backend can do beyond the contract's minimum (td_backend_ops.caps, and per group
 * td_backend_args.caps). */
enum {
    /* submit may also be called from the thread that issued a blocking operation, when the group
     * had nothing queued or running (it still gets one td_coll at a time, in issue order). That
     * saves the hand-off to the worker thread and back, which is most of a small operation's
     * time. Leave it out if the backend cares which thread calls it. */
    TD_BACKEND_CAP_CALLER_THREAD = 1u << 0,
    /* With CALLER_THREAD: asynchronous operations, too, are handed over on the issuing thread when
     * the group is idle, so that they reach the backend in the order the program issued them
     * across all its groups (their futures are then often complete when the call returns). For a
     * backend whose blocking calls exclude each other process-wide (mpi below
     * MPI_THREAD_MULTIPLE): run by the workers of two groups, they could start in different
     * orders on different ranks and wait for each other. */
    TD_BACKEND_CAP_ASYNC_ON_CALLER = 1u << 1,
    /* The backend's runtime assigns rank and size (mpi: the MPI launcher). td_pg_create then does
     * no rendezvous and gives the root group a store of this process only (a HashStore) unless
     * options->store is given: create gets a store the other ranks do not see, and must not need
     * one. For a root group create is called with rank and size -1 and global_ranks NULL and fills
     * *args->world_rank and *args->world_size (the front end warns, as PyTorch does for MPI, when
     * the options gave other values); subgroups are created as with any backend. */
    TD_BACKEND_CAP_RUNTIME_WORLD = 1u << 2,
    /* submit never reads td_coll.deadline_ns (an operation, once started, runs to its end or to
     * abort: a blocking MPI call). For a blocking operation handed over on the caller's thread the
     * front end then leaves it TD_DEADLINE_NONE and reads the clock only if the operation outlives
     * submit (the group's timeout still watches it from then on): the clock is a cache line that
     * the timer interrupt writes, most of a small operation's cost after a context switch. */
    TD_BACKEND_CAP_NO_DEADLINE = 1u << 3,
};

typedef struct td_backend_args {
    td_store *store;        /* the group's own store (already prefixed with the group's name) */
    int rank;               /* in the group */
    int size;
    const int *global_ranks;/* size entries: global rank of each group rank */
    int64_t timeout_ms;
    const char *group_name;
    void *parent_state;     /* the parent group's backend state when the parent runs the same
                               backend (for new_group), else NULL; a backend may share resources */
    /* Out: this group's capabilities, ops->caps on entry; create may change them for the group
     * (mpi adds TD_BACKEND_CAP_ASYNC_ON_CALLER below MPI_THREAD_MULTIPLE). */
    unsigned *caps;
    /* Out, with TD_BACKEND_CAP_RUNTIME_WORLD for a root group (rank == -1): this process's rank
     * and the world's size as the runtime assigned them. NULL otherwise. */
    int *world_rank;
    int *world_size;
} td_backend_args;

typedef struct td_backend_ops {
    const char *name;
    /* Connects to the peers (through args->store, within args->timeout_ms) and returns the state. */
    td_status (*create)(const td_backend_args *args, void **state);
    /* Starts (or runs) one operation; see the header comment. A non-TD_OK return means the
     * operation was not started and must not be completed by the backend. */
    td_status (*submit)(void *state, const td_coll *coll, td_work *work);
    /* Fails every operation in flight and every later one with (status, message): the group is
     * being destroyed (status TD_ERR_CLOSED) or has failed. Must not wait for peers. May be called
     * more than once and from any thread, while submit runs on the worker (that is how a blocked
     * submit is woken). May be NULL. */
    void (*abort)(void *state, td_status status, const char *message);
    /* Frees the state after abort; every submitted operation has been completed by then. */
    void (*destroy)(void *state);
    /* TD_OK if the backend can run kind on dtype with op, else TD_ERR_UNSUPPORTED with a message.
     * NULL means it supports everything the reduce kernels define. */
    td_status (*supports)(void *state, td_coll_kind kind, td_dtype dtype, td_reduce_op op);
    /* TD_BACKEND_CAP_* bits. */
    unsigned caps;
} td_backend_ops;

/* Registers a backend by ops->name (the ops struct must outlive the program's use of it).
 * TD_ERR_ALREADY if the name is taken. */
TD_API td_status td_register_backend(const td_backend_ops *ops);

/* The threaded backend (ranks as threads of one process): fails every operation in flight or
 * later in every threaded group of this process with TD_ERR_CLOSED and message, waking ranks
 * blocked in a collective. For test harnesses, when one rank thread fails while the others wait
 * for it (register it with td_test_add_abort_hook). Groups created afterwards are unaffected. */
TD_API void td_threaded_abort_all(const char *message);

#ifdef __cplusplus
}
#endif
#endif
