/* tdist/pg.h: process groups and collectives (torch.distributed's c10d in C).
 *
 * A process group (td_pg) is a set of ranks that run collectives together on a backend: "auto"
 * (the default: shared memory within a host, tcp between hosts), "shm" (one host), "tcp"
 * (sockets), "threaded" (ranks as threads of one process), "mpi", and, as they arrive, "nccl", or
 * a backend the application registers. Ranks meet through a store (tdist/store.h),
 * given explicitly or through an init_method URL (env://, tcp://, file://).
 *
 * Every operation is asynchronous and runs in issue order on the group's worker: pass a
 * td_future ** to get the Work handle, or NULL to block until the operation is done (the call then
 * returns the operation's own status). Arguments are checked before anything is sent, with
 * PyTorch's messages. Tensors are borrowed and must stay alive, unchanged, until the operation
 * completes; in-place operations write their results into the tensors given. Non-contiguous
 * tensors work (they are packed and unpacked around the transfer).
 *
 * Ranks given to collectives (roots, peers) are ranks IN THE GROUP, as PyTorch's group_src/dst;
 * td_pg_group_rank / td_pg_global_rank translate. A NULL group means the default group (see the
 * end of this header). docs/collectives.md lists every call with its errors.
 *
 * Failures: a peer that dies or disconnects fails every pending and later operation that needs it
 * with TD_ERR_PEER_LOST naming the rank; an operation that passes the group's timeout fails with
 * TD_ERR_TIMEOUT. A failed group stays failed (every later call returns the same error); destroy it
 * and create a new one.
 */
#ifndef TDIST_PG_H
#define TDIST_PG_H

#include <stdbool.h>
#include <stdint.h>

#include <tdist/future.h>
#include <tdist/status.h>
#include <tdist/tensor.h>
#include <tdist/value.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef TD_STORE_DECLARED /* declared by store.h, pg.h and rpc.h: C99 allows one typedef */
#define TD_STORE_DECLARED
typedef struct td_store td_store;
#endif
typedef struct td_pg td_pg;

/* ---- reduce operations with their argument -------------------------------------------------- */

/* A reduce operation as collectives take it: the kind plus PREMUL_SUM's factor. */
typedef struct td_op {
    td_reduce_op kind;
    double factor; /* PREMUL_SUM only: each rank's input is multiplied by it before the sum */
} td_op;

/* A td_op value: a compound literal in C, a braced temporary in C++. */
#ifdef __cplusplus
#define TD_OP_MAKE(kind, factor) (td_op{(kind), (factor)})
#else
#define TD_OP_MAKE(kind, factor) ((td_op){(kind), (factor)})
#endif
#define TD_OP_SUM TD_OP_MAKE(TD_SUM, 1.0)
#define TD_OP_PRODUCT TD_OP_MAKE(TD_PRODUCT, 1.0)
#define TD_OP_MIN TD_OP_MAKE(TD_MIN, 1.0)
#define TD_OP_MAX TD_OP_MAKE(TD_MAX, 1.0)
#define TD_OP_BAND TD_OP_MAKE(TD_BAND, 1.0)
#define TD_OP_BOR TD_OP_MAKE(TD_BOR, 1.0)
#define TD_OP_BXOR TD_OP_MAKE(TD_BXOR, 1.0)
#define TD_OP_AVG TD_OP_MAKE(TD_AVG, 1.0)
#define TD_OP_PREMUL_SUM(f) TD_OP_MAKE(TD_PREMUL_SUM, (f))
static inline td_op td_op_of(td_reduce_op kind)
{
    td_op op = TD_OP_MAKE(kind, 1.0);
    return op;
}

/* ---- creating groups ------------------------------------------------------------------------ */

#define TD_PG_DEFAULT_TIMEOUT_MS (30LL * 60 * 1000) /* 30 minutes, as PyTorch */
#define TD_ANY_SOURCE (-1)

typedef struct td_pg_options {
    const char *backend;     /* NULL: TDIST_BACKEND, else the default backend, "auto" */
    const char *init_method; /* rendezvous URL; NULL with no store means "env://" */
    td_store *store;         /* explicit store (borrowed; the group keeps a reference) */
    int rank;                /* -1: from the URL or the environment */
    int world_size;          /* -1: from the URL or the environment */
    int64_t timeout_ms;      /* 0: TD_PG_DEFAULT_TIMEOUT_MS (or TDIST_TIMEOUT_MS) */
    const char *group_name;  /* NULL: "0" for a group made by td_pg_create; new_group names its
                                subgroups "1", "2", ... in creation order within their root group */
    const char *debug_level; /* "OFF", "INFO" or "DETAIL" (any case); NULL: TDIST_DEBUG, and for
                                new_group the parent's. INFO logs each operation; DETAIL also checks
                                before each collective that every rank runs the same one. */
} td_pg_options;

#define TD_PG_OPTIONS_INIT {NULL, NULL, NULL, -1, -1, 0, NULL, NULL}

/* Creates a group (the world of its ranks); every rank must call it. */
TD_API td_status td_pg_create(const td_pg_options *options, td_pg **out);
/* new_group: every rank of parent calls it with the same sorted-or-not list of parent ranks. A
 * member gets a working group; a non-member gets a handle whose rank is -1 and whose operations
 * fail with TD_ERR_NOT_MEMBER. options may be NULL (backend and timeout of the parent). */
TD_API td_status td_pg_new_group(td_pg *parent, const int *ranks, int n, const td_pg_options *options,
                                 td_pg **out);
/* Fails pending operations with TD_ERR_CLOSED, closes the group's connections and frees it. Every
 * group must be destroyed (subgroups are independent of their parent). NULL is a no-op. */
TD_API void td_pg_destroy(td_pg *pg);

/* ---- queries -------------------------------------------------------------------------------- */

TD_API int td_pg_rank(const td_pg *pg);        /* -1 for a non-member */
TD_API int td_pg_size(const td_pg *pg);        /* -1 for a non-member */
TD_API const char *td_pg_name(const td_pg *pg);
TD_API const char *td_pg_backend(const td_pg *pg);
TD_API int64_t td_pg_timeout_ms(const td_pg *pg);
/* Ranks relative to the root group the group was made from ("global" ranks). */
TD_API td_status td_pg_global_rank(const td_pg *pg, int group_rank, int *global_rank);
TD_API td_status td_pg_group_rank(const td_pg *pg, int global_rank, int *group_rank);
/* The global ranks of the group's members, in group-rank order (borrowed, size entries). */
TD_API const int *td_pg_ranks(const td_pg *pg, int *size);

/* ---- collectives ---------------------------------------------------------------------------- */

TD_API td_status td_pg_broadcast(td_pg *pg, td_tensor *tensor, int root, td_future **work);
TD_API td_status td_pg_all_reduce(td_pg *pg, td_tensor *tensor, td_op op, td_future **work);
TD_API td_status td_pg_all_reduce_coalesced(td_pg *pg, td_tensor *const *tensors, int n, td_op op,
                                            td_future **work);
TD_API td_status td_pg_reduce(td_pg *pg, td_tensor *tensor, int root, td_op op, td_future **work);
/* outputs: size tensors shaped like input. */
TD_API td_status td_pg_all_gather(td_pg *pg, td_tensor *const *outputs, td_tensor *input, td_future **work);
/* output: size * input.numel elements (all_gather_into_tensor). */
TD_API td_status td_pg_all_gather_into_tensor(td_pg *pg, td_tensor *output, td_tensor *input, td_future **work);
/* n inputs; outputs[r * n + i] receives rank r's inputs[i]. */
TD_API td_status td_pg_all_gather_coalesced(td_pg *pg, td_tensor *const *outputs, td_tensor *const *inputs, int n,
                                            td_future **work);
/* outputs: size tensors on root, NULL on other ranks. */
TD_API td_status td_pg_gather(td_pg *pg, td_tensor *const *outputs, td_tensor *input, int root, td_future **work);
/* inputs: size tensors on root, NULL on other ranks. */
TD_API td_status td_pg_scatter(td_pg *pg, td_tensor *output, td_tensor *const *inputs, int root, td_future **work);
/* inputs: size tensors; rank r's output is the reduction of everyone's inputs[r]. */
TD_API td_status td_pg_reduce_scatter(td_pg *pg, td_tensor *output, td_tensor *const *inputs, td_op op,
                                      td_future **work);
/* input: size * output.numel elements (reduce_scatter_tensor). */
TD_API td_status td_pg_reduce_scatter_tensor(td_pg *pg, td_tensor *output, td_tensor *input, td_op op,
                                             td_future **work);
/* outputs[r] receives rank r's inputs[me]. */
TD_API td_status td_pg_all_to_all(td_pg *pg, td_tensor *const *outputs, td_tensor *const *inputs, td_future **work);
/* Splits are counts of dim-0 slices per rank; NULL means equal splits (dim 0 divisible by size). */
TD_API td_status td_pg_all_to_all_single(td_pg *pg, td_tensor *output, td_tensor *input, const int64_t *output_splits,
                                         const int64_t *input_splits, td_future **work);
TD_API td_status td_pg_barrier(td_pg *pg, td_future **work);
/* Blocking. Rank 0 waits for every other rank up to timeout_ms (0: the group's timeout) and fails
 * naming the first rank that did not arrive ("[Rank 0]: Rank 2 failed to pass monitoredBarrier in
 * 5000 ms"), or every such rank when wait_all_ranks. */
TD_API td_status td_pg_monitored_barrier(td_pg *pg, int64_t timeout_ms, bool wait_all_ranks);

/* ---- point to point ------------------------------------------------------------------------- */

TD_API td_status td_pg_send(td_pg *pg, td_tensor *tensor, int dst, int tag, td_future **work);
/* src may be TD_ANY_SOURCE. When blocking (work NULL), *sender (may be NULL) gets the source rank;
 * when async, the future's value is the source rank (an int). */
TD_API td_status td_pg_recv(td_pg *pg, td_tensor *tensor, int src, int tag, int *sender, td_future **work);

typedef struct td_p2p_op {
    bool is_send;
    td_tensor *tensor;
    int peer;
    int tag;
} td_p2p_op;
/* Posts all n operations together (batch_isend_irecv); works[i] (n entries) gets each one's future. */
TD_API td_status td_pg_batch_isend_irecv(td_pg *pg, const td_p2p_op *ops, int n, td_future **works);

/* ---- object collectives (blocking, over td_value) -------------------------------------------- */

/* *out: a new list of size values, rank r's object at index r. */
TD_API td_status td_pg_all_gather_object(td_pg *pg, td_value *obj, td_value **out);
/* On dst, *out gets the list; on other ranks out must be NULL. */
TD_API td_status td_pg_gather_object(td_pg *pg, td_value *obj, td_value **out, int dst);
/* list: a td_value list of the same length on every rank; on non-src ranks its items are replaced
 * by src's. */
TD_API td_status td_pg_broadcast_object_list(td_pg *pg, td_value *list, int src);
/* in_list on src: size values; *out gets this rank's one. in_list is ignored elsewhere. */
TD_API td_status td_pg_scatter_object_list(td_pg *pg, td_value **out, td_value *in_list, int src);

/* ---- the default group (torch.distributed's module-level API) ------------------------------- */

/* The default group belongs to the process, with one exception: each rank thread of a threaded
 * test (TD_TEST(..., .threads = true), tdist/testing.h) has its own, as PyTorch's
 * MultiThreadedTestCase gives each rank thread a thread-local world. On a rank thread,
 * td_init_process_group, td_destroy_process_group, td_is_initialized, td_default_pg,
 * td_get_rank, td_get_world_size, td_new_group and every td_pg_ call with a NULL group act on
 * that rank's default group, and what the rank leaves there is destroyed when its thread ends.
 * Any other thread, including one a rank thread starts (and tdist's own worker threads), uses the
 * process's default group, as a new Python thread gets an empty thread-local world: pass such a
 * thread the rank's group explicitly (td_default_pg() read on the rank thread). Groups made with
 * td_new_group are best destroyed on the thread that made them. */

/* PyTorch's errors: a second init fails with "trying to initialize the default process group
 * twice!"; use before init with "Default process group has not been initialized, please make sure
 * to call init_process_group."; a store with an init_method with "Cannot specify both init_method
 * and store.". */
TD_API td_status td_init_process_group(const td_pg_options *options);
/* Destroys the default group and every group made from it with td_new_group. */
TD_API void td_destroy_process_group(void);
TD_API bool td_is_initialized(void);
TD_API td_pg *td_default_pg(void); /* borrowed; NULL before init */
TD_API int td_get_rank(void);       /* -1 before init */
TD_API int td_get_world_size(void); /* -1 before init */
/* This process's rank on its node and the number of ranks on its node, as its launcher set them
 * (no init needed): LOCAL_RANK / LOCAL_WORLD_SIZE (tdrun, torchrun), else Open MPI's
 * OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE, else MPICH's MPI_LOCALRANKID / MPI_LOCALNRANKS, else
 * Slurm's SLURM_LOCALID with SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE's first count. The size
 * comes from the same launcher as the rank. -1 when that launcher does not set it or it is not a
 * valid number (docs/environment.md). */
TD_API int td_get_local_rank(void);
TD_API int td_get_local_world_size(void);
/* new_group on the default group; the group is destroyed with it (td_pg_destroy also works). */
TD_API td_status td_new_group(const int *ranks, int n, const td_pg_options *options, td_pg **out);

/* ---- profiling (c10d's record_param_comms) ------------------------------------------------- */

/* One finished operation, as a profiler sees it. Strings and shape are valid during the call. */
typedef struct td_pg_trace_event {
    const char *name;       /* "<backend>:<op>": "tcp:all_reduce", "threaded:recvAnySource" */
    const char *group_name;
    int rank;               /* in the group */
    uint64_t seq;           /* the group's number for the operation (p2p ops count apart) */
    bool is_async;          /* issued with a work handle (else the call blocked) */
    td_status status;
    td_dtype dtype;
    int64_t numel_in, numel_out;
    int ndim;               /* the shape of the (first) input tensor; -1 when not recorded */
    const int64_t *shape;
    int64_t begin_ns, end_ns; /* CLOCK_MONOTONIC: issue and completion */
} td_pg_trace_event;

/* Calls fn(event, arg) once per finished operation of pg (collectives and p2p; none for the
 * checks DETAIL adds), on tdist's callback thread. fn NULL stops tracing. Setting it while
 * operations are in flight is safe; they may or may not be reported. */
TD_API void td_pg_set_trace_callback(td_pg *pg, void (*fn)(const td_pg_trace_event *event, void *arg), void *arg);

/* ---- backends ------------------------------------------------------------------------------- */

/* Whether a backend of that name is registered (built in or by td_register_backend). */
TD_API bool td_backend_available(const char *name);
/* Capability queries: can this group's backend run `collective` ("all_reduce", "send", ...) on
 * dtype with op? TD_OK, or TD_ERR_UNSUPPORTED with a message saying what is not supported. */
TD_API td_status td_pg_supports(const td_pg *pg, const char *collective, td_dtype dtype, td_reduce_op op);

#ifdef __cplusplus
}
#endif
#endif
