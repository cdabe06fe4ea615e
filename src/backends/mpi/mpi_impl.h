/* Internal: the parts of the "mpi" backend (src/backends/mpi), built when CMake finds an MPI.
 *
 *   runtime.c  the process-wide MPI: initialization (or adopting the program's), the thread level,
 *              the lock that serializes MPI calls when MPI is not MPI_THREAD_MULTIPLE, the progress
 *              thread that completes outstanding requests, error strings
 *   types.c    td_dtype and td_op to MPI datatypes and ops, with user-defined MPI ops where MPI
 *              lacks the type (float16, bfloat16) or tdist's semantics differ (NaN in MIN/MAX)
 *   backend.c  the td_backend_ops: communicators for groups and subgroups, every collective and
 *              point-to-point kind as MPI calls, completion, abort
 *
 * An operation in flight is an mpi_op. Its state moves once from PENDING to COMPLETING (the thread
 * that saw its request finish) or to ABORTED (abort got there first and failed its work); whoever
 * wins owns the work. An aborted op whose request MPI has not finished stays with the progress
 * thread until MPI lets go of it; op records (and their scratch buffers) are process-wide so that
 * such an op may outlive its group. */
#ifndef TDIST_BACKENDS_MPI_IMPL_H
#define TDIST_BACKENDS_MPI_IMPL_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <tdist/backend.h>

/* ---- runtime.c ---------------------------------------------------------------------------- */

/* Initializes MPI once per process (MPI_Init_thread asking for MPI_THREAD_MULTIPLE, or the level
 * TDIST_MPI_THREAD_LEVEL names), or adopts an MPI the program initialized, at any level (below
 * MPI_THREAD_SERIALIZED only on the thread that initialized it: funneled mode). */
td_status mpi_rt_init(void);
/* A group's hold on the runtime: the first starts the progress thread, the last stops and joins
 * it. acquire initializes MPI if needed. */
td_status mpi_rt_acquire(void);
void mpi_rt_release(void);
/* Around every MPI call tdist makes: a process-wide lock when MPI runs at MPI_THREAD_SERIALIZED,
 * nothing at MPI_THREAD_MULTIPLE or in funneled mode (one flag read inline: this is on the path of
 * every blocking collective). Never held across a wait unless the MPI call itself blocks. */
extern bool mpi_serialized; /* set once, when MPI is initialized */
void mpi_serial_lock(void);
void mpi_serial_unlock(void);
static inline void mpi_enter(void)
{
    if (mpi_serialized)
        mpi_serial_lock();
}
static inline void mpi_leave(void)
{
    if (mpi_serialized)
        mpi_serial_unlock();
}
bool mpi_thread_multiple(void);
/* Funneled mode: MPI below MPI_THREAD_SERIALIZED, so tdist calls it only on the thread that
 * initialized it (the MPI thread) and runs no progress thread. */
bool mpi_funneled(void);
/* Set once, when MPI is initialized (before any group exists): below MPI_THREAD_SERIALIZED tdist
 * calls MPI only on mpi_main_thread, the thread that initialized it. */
extern bool mpi_funneled_mode;
extern pthread_t mpi_main_thread;
/* true unless in funneled mode on a thread other than the MPI thread (inline: every blocking
 * collective asks). */
static inline bool mpi_on_mpi_thread(void)
{
    return !mpi_funneled_mode || pthread_equal(pthread_self(), mpi_main_thread);
}
/* TD_OK where this thread may call MPI, else TD_ERR_INVALID naming what (e.g. "the all_reduce")
 * and the rule. */
td_status mpi_check_thread(const char *what);
/* The driver of works in funneled mode (td_work_set_driver): on the MPI thread, one test of the
 * requests in flight; false when not in funneled mode (the progress thread works). */
bool mpi_rt_progress(void);
/* Sets the thread's error from an MPI error code: "<what> failed: <MPI's error string>", with a
 * td_status chosen by the error class. Returns that status. */
td_status mpi_error(int code, const char *what);
/* The same text, malloc'd, for a work's message; *status gets the code. */
char *mpi_error_text(int code, const char *what, td_status *status);

typedef struct mpi_group mpi_group;
typedef struct mpi_op mpi_op;

enum { MPI_OP_PENDING = 0, MPI_OP_COMPLETING = 1, MPI_OP_ABORTED = 2 };

struct mpi_op {
    MPI_Request req;
    MPI_Status status;
    _Atomic int state;
    td_work *work;
    mpi_group *g;       /* valid while the op is PENDING or COMPLETING */
    td_coll coll;       /* a copy: the front end's td_coll lives as long as the work */
    int size;           /* the group's size */
    int me;             /* this rank in the group */
    /* Scratch buffers, kept (with their capacity) when the op is recycled. */
    void *scratch[2];
    size_t scratch_cap[2];
    int *ints;          /* counts and displacements for the v-collectives (4 * size entries) */
    size_t ints_cap;
    void *unpack;       /* scratch[] holding received blocks to copy into out_blocks, or NULL */
    bool linked;           /* on the group's in-flight list (guarded by the group's lock) */
    mpi_op *gprev, *gnext; /* the group's in-flight list */
    mpi_op *next;          /* free list / the progress thread's incoming list */
};

/* An op record from the process-wide pool (zeroed but for its scratch buffers). */
mpi_op *mpi_op_get(void);
void mpi_op_put(mpi_op *op);
/* Zeroes op but for its scratch buffers; frees op and its buffers. */
void mpi_op_reset(mpi_op *op);
void mpi_op_free(mpi_op *op);
/* Grows scratch buffer i to at least bytes; NULL with the error set when allocation fails. */
void *mpi_op_scratch(mpi_op *op, int i, size_t bytes);
/* Hands a posted op to the progress thread (in funneled mode: to the list mpi_rt_progress tests),
 * which calls mpi_op_complete when its request ends. */
void mpi_rt_track(mpi_op *op);

/* ---- backend.c ---------------------------------------------------------------------------- */

/* Called (on the progress thread, or the worker when an op finished at once) once op's request
 * completed; finishes the op's work unless it was aborted, and recycles op. */
void mpi_op_complete(mpi_op *op);

/* ---- types.c ------------------------------------------------------------------------------ */

/* Creates the datatypes and user-defined ops tdist adds (after MPI_Init; once). */
td_status mpi_types_init(void);
/* Filled by mpi_types_init, before any group exists; read through the two below. */
extern MPI_Datatype mpi_dtypes[TD_DTYPE_COUNT];
extern MPI_Op mpi_ops[TD_REDUCE_OP_COUNT][TD_DTYPE_COUNT];
/* The MPI datatype for dtype; MPI_DATATYPE_NULL when this MPI has none. Inline: asked on every
 * call. */
static inline MPI_Datatype mpi_datatype(td_dtype dtype)
{
    return (unsigned)dtype < TD_DTYPE_COUNT ? mpi_dtypes[dtype] : MPI_DATATYPE_NULL;
}
/* The MPI op that reduces dtype with kind as tdist does; MPI_OP_NULL when none (AVG and
 * PREMUL_SUM among them: the front end resolves them into SUM). */
static inline MPI_Op mpi_reduce_op(td_reduce_op kind, td_dtype dtype)
{
    return (unsigned)kind < TD_REDUCE_OP_COUNT && (unsigned)dtype < TD_DTYPE_COUNT ? mpi_ops[kind][dtype]
                                                                                   : MPI_OP_NULL;
}

#endif
