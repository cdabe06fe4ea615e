/* tdist/backend.h: writing a process-group backend.
 *
 * A process group is the front end (tdist/pg.h: argument checks, rank translation, packing of
 * non-contiguous and list arguments, debug-level checks, the worker that runs operations in issue
 * order, futures) plus a backend that moves the bytes. This header is the contract between them;
 * the built-in backends (tcp, threaded, shm, auto, mpi, nccl) implement it, and an application can
 * register its own with td_register_backend.
 *
 * The front end hands the backend one td_coll at a time, in issue order, from the group's worker
 * thread (or, for a backend that sets inline_submit, from the caller of a blocking operation, and with
 * issue_on_caller of any operation). Arguments are already checked and normalized: ranks are group ranks, every buffer is
 * contiguous memory of `dtype`, list forms are per-rank block arrays, coalesced forms are one
 * flattened buffer. The backend completes each operation exactly once with td_work_done, either
 * before submit returns (a blocking algorithm running on the worker thread) or later from its own
 * progress thread (an asynchronous send, say). It must never call back into the front end's
 * collective API from submit.
 */
#ifndef TDIST_BACKEND_H
#define TDIST_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/pg.h>
#include <tdist/status.h>
#include <tdist/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum td_coll_kind {
    TD_COLL_BROADCAST = 0, /* out (count): root's contents to everyone, in place */
    TD_COLL_ALL_REDUCE,    /* out (count): reduced in place on every rank */
    TD_COLL_REDUCE,        /* out (count): reduced in place on root; others' out is scratch */
    TD_COLL_ALL_GATHER,    /* in (count) from every rank into out_blocks[r] */
    TD_COLL_GATHER,        /* in (count) from every rank into out_blocks[r] on root */
    TD_COLL_SCATTER,       /* in_blocks[r] on root to rank r's out (count) */
    TD_COLL_REDUCE_SCATTER,/* in_blocks[r] (count each) of every rank reduced into rank r's out */
    TD_COLL_ALL_TO_ALL,    /* in_blocks[r] (in_counts[r]) to rank r, arriving in its out_blocks[me] */
    TD_COLL_BARRIER,       /* no data */
    TD_COLL_SEND,          /* in (count) to peer with tag */
    TD_COLL_RECV,          /* out (count) from peer (or TD_ANY_SOURCE) with tag */
    TD_COLL_KIND_COUNT
} td_coll_kind;

/* "broadcast", "all_reduce", ... */
TD_API const char *td_coll_kind_name(td_coll_kind kind);

typedef struct td_coll {
    td_coll_kind kind;
    td_dtype dtype;
    td_op op;            /* reducing kinds; AVG must be finished with td_reduce_finish, PREMUL_SUM
                            inputs scaled with td_reduce_premul (the backend does both) */
    int root;            /* BROADCAST, REDUCE, GATHER, SCATTER */
    int peer;            /* SEND, RECV */
    int tag;             /* SEND, RECV */
    uint64_t seq;        /* per-group sequence number of collectives (p2p ops have their own) */
    int64_t deadline_ns; /* CLOCK_MONOTONIC; TD_DEADLINE_NONE (INT64_MAX) for none */

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

/* The front end's end of a call run by td_backend_ops.run_now: takes the call's status, returns
 * what the call returns. */
typedef td_status (*td_run_done)(void *arg, td_status status);

typedef struct td_backend_args {
    td_store *store;        /* the group's own store (already prefixed with the group's name) */
    int rank;               /* in the group */
    int size;
    const int *global_ranks;/* size entries: global rank of each group rank */
    int64_t timeout_ms;
    const char *group_name;
    void *parent_state;     /* the parent group's backend state when the parent runs the same
                               backend (for new_group), else NULL; a backend may share resources */
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
    /* Optional, for a backend whose runtime assigns the ranks (mpi: the MPI launcher): this
     * process's rank and the world's size. With it, td_pg_create takes rank and size from here
     * (warning, as PyTorch does for MPI, when the options gave other values), does no rendezvous,
     * and gives the group a store of this process only (a HashStore) unless options->store is
     * given: create then gets a store the other ranks do not see, and must not need one. May be
     * NULL. */
    td_status (*world)(int *rank, int *size);
    /* true: submit may also be called from the thread that issued a blocking operation, when the
     * group had nothing queued or running (it still gets one td_coll at a time, in issue order).
     * That saves the hand-off to the worker thread and back, which is most of a small operation's
     * time. Leave it false if the backend cares which thread calls it. */
    bool inline_submit;
    /* Optional, with inline_submit: true when asynchronous operations, too, should be handed over
     * on the issuing thread when the group is idle, so that they reach the backend in the order the
     * program issued them across all its groups (their futures are then often complete when the
     * call returns). For a backend whose blocking calls exclude each other process-wide (mpi below
     * MPI_THREAD_MULTIPLE): run by the workers of two groups, they could start in different orders
     * on different ranks and wait for each other. May be NULL. */
    bool (*issue_on_caller)(void *state);
    /* Optional, for a backend that at times has no thread of its own to advance its operations
     * (mpi below MPI_THREAD_SERIALIZED, where only the thread that initialized MPI may call it): a
     * thread waiting on the future of one of its operations calls this in a loop until the future
     * completes, and td_future_is_completed calls it once. It advances what it can of the
     * backend's operations in this process from the calling thread (every group's: it gets no
     * state, so it may run while a group is being destroyed) and returns at once; false when
     * waiters need not call it (the backend completes its operations itself), and they block
     * instead. May be NULL. */
    bool (*progress)(void);
    /* Optional, with inline_submit: runs a collective (never SEND or RECV) of a blocking call to its
     * end on the calling thread, then returns done(arg, status) (the error set on failure), in place
     * of submit and td_work_done: no work record, no future, no completion from another thread.
     * done is the front end's end of the call; calling it last, as a tail call, lets the front end
     * hand over with a tail call too, so that the program's frame is the next one returned to. The
     * front end calls it only where runs_now(state) said yes when the group was created, only on
     * an idle group (nothing queued or running, the group not failed), with debug checks and
     * traces off and every buffer the caller's own. Nothing watches such a call (its deadline_ns
     * is TD_DEADLINE_NONE): offer it only where the group's timeout could not end a blocking call
     * anyway, as with a blocking MPI call. A failure fails the group as a failed work does. For a
     * backend whose blocking operation is one call into a library (mpi): the front end's
     * bookkeeping per call is then a few dozen instructions. May be NULL (both are). */
    td_status (*run_now)(void *state, const td_coll *coll, td_run_done done, void *arg);
    bool (*runs_now)(void *state);
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
