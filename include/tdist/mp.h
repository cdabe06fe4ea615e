/* tdist/mp.h: torch.multiprocessing in C: shared-memory tensors, process queues that carry them,
 * processes started by fork or spawn, events, pools, and thread names.
 *
 * Sharing. td_tensor_share_memory moves a tensor's storage into shared memory in place: every view
 * of the storage sees the new memory, and processes that receive it (through a queue, or as the
 * arguments of a spawned process) map the same pages, so writes are visible both ways. Two
 * strategies, chosen at run time (td_mp_set_sharing_strategy, or TDIST_SHARING_STRATEGY):
 *   "file_descriptor" (default): an unlinked segment whose fd travels with the message
 *       (SCM_RIGHTS); each shared storage keeps one fd open in each process that holds it.
 *   "file_system": a named segment in /dev/shm with a refcount header; the last process to let
 *       go removes it, and the tdist-shm-manager daemon removes what crashed processes left.
 * Segments are named "tdist.<creator pid>.<n>" in /dev/shm (file_descriptor ones only for the
 * instant between creation and unlink).
 *
 * Queues. A td_mp_queue carries td_values between processes; tensors travel as shared-memory
 * handles, never as bytes (a tensor not yet shared is moved into shared memory by the put). A
 * process that receives a storage it already holds gets the same td_storage back, and views sent
 * together rebuild on one storage. A tensor keeps its requires_grad and its kind (plain or
 * Parameter, tdist/autograd.h) but not its .grad, hooks or graph: a non-leaf that requires grad is
 * refused (TD_ERR_INVALID, "Cowardly refusing to serialize non-leaf tensor which requires_grad,
 * ..."; send its td_autograd_detach). Create a queue before starting the processes that use it: they
 * inherit it (fork) or receive it in their arguments (spawn): put td_mp_queue_value(q) into them.
 *
 * Processes. Entry points are registered by name (TD_MP_ENTRY) so that both start methods can
 * run them: fork (the child continues from a copy of the parent) and spawn (fork + exec of this
 * program, which must call TD_MP_MAIN_PROLOGUE first thing in main). Objects that own threads or
 * child processes (pools, process contexts) refuse to be used from a forked child.
 *
 * Ownership follows tensor.h: out-parameters give a new reference, arguments are borrowed unless
 * said otherwise. Timeouts are milliseconds; 0 means wait forever, TD_MP_NO_WAIT means do not wait.
 * See docs/multiprocessing.md.
 */
#ifndef TDIST_MP_H
#define TDIST_MP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <tdist/status.h>
#include <tdist/tensor.h>
#include <tdist/value.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TD_MP_NO_WAIT ((int64_t)-1)

/* ---- sharing strategies ------------------------------------------------------------------- */

typedef enum td_mp_strategy {
    TD_MP_FILE_DESCRIPTOR = 0,
    TD_MP_FILE_SYSTEM = 1,
} td_mp_strategy;

/* Process-wide; read when a storage is shared or sent. The first call reads
 * TDIST_SHARING_STRATEGY (a bad value is reported once on stderr and the default is used). A
 * forked child inherits the setting; a spawned one starts from the environment. */
TD_API td_status td_mp_set_sharing_strategy(td_mp_strategy strategy);
TD_API td_mp_strategy td_mp_get_sharing_strategy(void);
/* Bit (1u << strategy) for each strategy this platform has (both on Linux). */
TD_API unsigned td_mp_all_sharing_strategies(void);
/* "file_descriptor" / "file_system", and back (TD_ERR_INVALID naming the choices). */
TD_API const char *td_mp_strategy_name(td_mp_strategy strategy);
TD_API td_status td_mp_strategy_from_name(const char *name, td_mp_strategy *out);

/* ---- shared storages ---------------------------------------------------------------------- */

/* Moves the storage into shared memory with the current strategy, in place (PyTorch's
 * share_memory_). Idempotent: an already shared storage is left alone. A 0-byte storage is left
 * alone too (nothing to map). The caller makes sure no other thread uses the storage meanwhile;
 * pointers obtained from td_storage_data / td_tensor_data before the move no longer point at it.
 * Fails cleanly (TD_ERR_IO / TD_ERR_NOMEM with the reason) when /dev/shm is full or the process
 * is out of file descriptors; the storage is then unchanged. */
TD_API td_status td_storage_share_memory(td_storage *s);
TD_API td_status td_tensor_share_memory(td_tensor *t);
TD_API bool td_tensor_is_shared(const td_tensor *t);

/* ---- device tensors ------------------------------------------------------------------------ *
 * Device tensors (cuda and sim) travel by IPC handle (torch's CUDA IPC): the consumer maps the
 * producer's memory, so writes are seen both ways; its stream first waits for the work the
 * producer had queued. The producer's block stays allocated ("limbo") after the producer lets go
 * while a consumer holds it; this frees the limbo blocks no consumer holds any more and returns
 * how many are still held (torch.cuda.ipc_collect). A received device tensor cannot be sent on:
 * clone it first. */
TD_API size_t td_mp_ipc_collect(void);

/* ---- values that carry mp objects --------------------------------------------------------- */

typedef struct td_mp_queue td_mp_queue;
typedef struct td_mp_event td_mp_event;

/* A td_value holding a queue or event (retained), for process arguments and queue messages. */
TD_API td_value *td_mp_queue_value(td_mp_queue *q);
TD_API td_value *td_mp_event_value(td_mp_event *e);
/* The queue / event inside such a value (borrowed), or NULL when v is not one. */
TD_API td_mp_queue *td_mp_value_queue(const td_value *v);
TD_API td_mp_event *td_mp_value_event(const td_value *v);

/* ---- queues ------------------------------------------------------------------------------- */

/* maxsize 0: unbounded (put does not wait for readers: messages the socket cannot take yet wait
 * in this process and a feeder thread sends them in order; only a process with 256 such unsent
 * messages waits in put, as each may hold a storage's fd); otherwise put waits while maxsize
 * messages are queued. A message carries at most 253 fds (file_descriptor storages 1 each, queues
 * 3, events 1), and dicts keyed by tensors cannot be sent. */
TD_API td_status td_mp_queue_new(int64_t maxsize, td_mp_queue **out);
TD_API td_mp_queue *td_mp_queue_retain(td_mp_queue *q);
/* The last release in a process closes it there (td_mp_queue_close) and frees it. */
TD_API void td_mp_queue_release(td_mp_queue *q);
/* Encodes v now (so errors return here and every tensor is shared when put returns) and sends it.
 * TD_ERR_TIMEOUT when a bounded queue stayed full for timeout_ms; TD_ERR_CLOSED after close. */
TD_API td_status td_mp_queue_put(td_mp_queue *q, const td_value *v, int64_t timeout_ms);
/* The next value, FIFO per producer. TD_ERR_TIMEOUT when none came within timeout_ms. */
TD_API td_status td_mp_queue_get(td_mp_queue *q, int64_t timeout_ms, td_value **out);
/* This process will put no more: waits until what it put is in the queue (its feeder's backlog
 * sent), then stops the feeder. Other processes keep using the queue. */
TD_API td_status td_mp_queue_close(td_mp_queue *q);
/* Advisory (other processes change them at any moment): messages in the queue. */
TD_API int64_t td_mp_queue_size(td_mp_queue *q);
TD_API bool td_mp_queue_empty(td_mp_queue *q);
TD_API bool td_mp_queue_full(td_mp_queue *q);

/* ---- events ------------------------------------------------------------------------------- */

/* A flag in shared memory that processes set, clear and wait on (multiprocessing.Event). */
TD_API td_status td_mp_event_new(td_mp_event **out);
TD_API td_mp_event *td_mp_event_retain(td_mp_event *e);
TD_API void td_mp_event_release(td_mp_event *e);
TD_API void td_mp_event_set(td_mp_event *e);
TD_API void td_mp_event_clear(td_mp_event *e);
TD_API bool td_mp_event_is_set(td_mp_event *e);
/* TD_OK once set; TD_ERR_TIMEOUT after timeout_ms. */
TD_API td_status td_mp_event_wait(td_mp_event *e, int64_t timeout_ms);

/* ---- entry points ------------------------------------------------------------------------- */

/* What processes and pool workers run: rank is the process's rank (or the worker's index), args
 * the arguments (borrowed). A pool task may set *result (a new reference) to return a value. A
 * failure's td_last_error() message is carried to the parent. */
typedef td_status (*td_mp_entry_fn)(int rank, const td_value *args, td_value **result);

typedef struct td_mp_entry {
    const char *name;
    td_mp_entry_fn fn;
    struct td_mp_entry *next;
} td_mp_entry;

TD_API void td_mp_entry_register(td_mp_entry *e);
TD_API td_mp_entry_fn td_mp_entry_find(const char *name);

/* Declares and registers an entry point named `ename`; the body sees rank, args and result. */
#define TD_MP_ENTRY(ename)                                                                \
    static td_status td_mp_entry_body_##ename(int rank, const td_value *args, td_value **result); \
    __attribute__((constructor)) static void td_mp_entry_reg_##ename(void)               \
    {                                                                                     \
        static td_mp_entry e = {.name = #ename, .fn = td_mp_entry_body_##ename};          \
        td_mp_entry_register(&e);                                                         \
    }                                                                                     \
    static td_status td_mp_entry_body_##ename(int rank, const td_value *args, td_value **result)

/* For the spawn start method: a spawned child is this program run again with a marker argument.
 * Call first in main: in a spawned child it runs the entry point and returns main's exit code;
 * otherwise it returns -1 and does nothing. */
TD_API int td_mp_child_main(int argc, char **argv);
#define TD_MP_MAIN_PROLOGUE(argc, argv)                  \
    do {                                                 \
        int td_mp_rc_ = td_mp_child_main((argc), (argv)); \
        if (td_mp_rc_ >= 0)                              \
            return td_mp_rc_;                            \
    } while (0)

/* ---- processes ---------------------------------------------------------------------------- */

typedef enum td_mp_start_method {
    TD_MP_FORK = 0,  /* fork(): the child runs the entry on a copy of this process */
    TD_MP_SPAWN = 1, /* fork + exec of /proc/self/exe: a fresh program; args are sent by handle */
} td_mp_start_method;

TD_API const char *td_mp_start_method_name(td_mp_start_method m); /* "fork", "spawn" */

typedef struct td_mp_spawn_opts {
    const char *entry;       /* a registered entry point */
    const td_value *args;    /* given to every process; NULL for none */
    int nprocs;              /* 0 means 1 */
    td_mp_start_method method;
    bool daemon;             /* the children are killed when the thread that started them exits */
} td_mp_spawn_opts;

/* torch.multiprocessing's ProcessContext: a set of started processes. */
typedef struct td_mp_context td_mp_context;

TD_API td_status td_mp_spawn(const td_mp_spawn_opts *opts, td_mp_context **out);
/* Waits for the processes. TD_OK when all exited 0; TD_ERR_TIMEOUT when some still run after
 * timeout_ms; when one fails, the others are terminated and TD_ERR_REMOTE names the first failure
 * as torch does: "process 1 terminated with exit code 3", "process 0 terminated with signal
 * SIGKILL", or "\n\n-- Process 2 terminated with the following error:\n<its message>". */
TD_API td_status td_mp_join(td_mp_context *ctx, int64_t timeout_ms);
TD_API int td_mp_context_size(const td_mp_context *ctx);
TD_API pid_t td_mp_context_pid(const td_mp_context *ctx, int rank);
/* True while the process runs. */
TD_API bool td_mp_is_alive(td_mp_context *ctx, int rank);
/* Its exit code (-signal when killed by one); TD_ERR_TIMEOUT while it runs. */
TD_API td_status td_mp_exitcode(td_mp_context *ctx, int rank, int *code);
/* Sends SIGTERM (then SIGKILL after grace_ms) to the processes still running and reaps them. */
TD_API void td_mp_terminate(td_mp_context *ctx, int64_t grace_ms);
/* Terminates what still runs, reaps, frees. */
TD_API void td_mp_context_release(td_mp_context *ctx);

/* ---- pools -------------------------------------------------------------------------------- */

typedef struct td_mp_pool td_mp_pool;

TD_API td_status td_mp_pool_new(int nworkers, td_mp_start_method method, td_mp_pool **out);
/* Runs entry on each element of the list or tuple `args` (one task per element, rank = the
 * worker's index) and returns the results in order as a new list. When tasks fail, the others
 * still finish, and the lowest-numbered failure is returned (TD_ERR_REMOTE with its message). A
 * worker that dies fails the call instead of hanging it. */
TD_API td_status td_mp_pool_map(td_mp_pool *p, const char *entry, const td_value *args, td_value **results);
TD_API int td_mp_pool_size(const td_mp_pool *p);
TD_API pid_t td_mp_pool_pid(const td_mp_pool *p, int worker);
/* No more tasks: workers exit once the queued ones are done. */
TD_API td_status td_mp_pool_close(td_mp_pool *p);
/* Waits for the workers to exit after close. */
TD_API td_status td_mp_pool_join(td_mp_pool *p, int64_t timeout_ms);
/* Kills the workers now (tasks in flight are lost). */
TD_API void td_mp_pool_terminate(td_mp_pool *p);
/* Terminates unless joined, then frees. */
TD_API void td_mp_pool_release(td_mp_pool *p);

/* ---- thread names ------------------------------------------------------------------------- */

/* The calling thread's name (torch.multiprocessing._set_thread_name): longer names are cut to 15
 * characters, the kernel's limit. NULL is TD_ERR_INVALID. */
TD_API td_status td_set_thread_name(const char *name);
/* Into out (at least 16 bytes for the whole name). */
TD_API td_status td_get_thread_name(char *out, size_t size);

/* ---- leak checking (tests) ---------------------------------------------------------------- */

/* Snapshot of this process's fds and shared-memory mappings and of the /dev/shm entries of the
 * tracked processes, compared at the end (spec: leak_checker). */
typedef struct td_mp_leak_checker td_mp_leak_checker;

TD_API td_status td_mp_leak_checker_begin(td_mp_leak_checker **out);
/* Also checks /dev/shm for "tdist.<pid>." entries (record children after starting them). */
TD_API void td_mp_leak_checker_track(td_mp_leak_checker *lc, pid_t pid);
/* TD_OK when fds, mappings and /dev/shm entries are back to the baseline, polling every 0.5 s up
 * to wait_ms (file_system cleanup may lag); else TD_ERR_INTERNAL naming what leaked. Frees lc. */
TD_API td_status td_mp_leak_checker_end(td_mp_leak_checker *lc, int64_t wait_ms);

#ifdef __cplusplus
}
#endif
#endif
