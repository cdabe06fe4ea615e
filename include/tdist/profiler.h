/* tdist/profiler.h: profiling RPCs (torch.autograd.profiler's RPC side, in C).
 *
 * A profiler records on the thread that starts it, until it is stopped there:
 *   - each RPC the thread makes (td_rpc_sync, td_rpc_async, td_rpc_remote, and the calls the RRef
 *     functions make for it) as one event named "rpc_{sync|async|remote}#{function}({caller} ->
 *     {callee})", from the call to its completion (for remote: the owner's creation reply), with
 *     the caller's worker id as node id;
 *   - what the callee did for that call, recorded on the callee while it ran the function (the
 *     builtin tensor functions, "aten::add" ..., the user scopes below, the RPCs it made with their
 *     own remote events) and sent back with the reply: each is merged as "{rpc event's
 *     name}#remote_op: {its name}" with is_remote true and the node id of the worker that
 *     recorded it, so nested calls compose ("rpc_async#f(worker1 -> worker2)#remote_op:
 *     rpc_async#g(worker2 -> worker3)#remote_op: aten::add");
 *   - user scopes: td_record_function_enter(name) ... td_record_function_exit() (nesting), each
 *     an event from enter to exit.
 * Events of a call still in flight when the profiler stops arrive when it completes. With
 * record_shapes the builtins record the shapes of their positional inputs (a non-tensor input as
 * a shape of 0 dims); with profile_memory, the bytes of the tensor each one returned.
 *
 * When no profiler runs, a call pays one relaxed atomic load for all this.
 *
 * Export: td_profiler_export_chrome_trace writes the events as a Chrome trace (JSON), for
 * chrome://tracing and Perfetto, one process track per worker. docs/profiling.md has the
 * details. */
#ifndef TDIST_PROFILER_H
#define TDIST_PROFILER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/status.h>
#include <tdist/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_profiler td_profiler;

typedef struct td_profiler_options {
    bool record_shapes;  /* input shapes of the builtins (local and remote) */
    bool profile_memory; /* bytes allocated for the builtins' results */
} td_profiler_options;

/* One recorded event. Strings and shapes belong to the profiler (valid until td_profiler_free). */
typedef struct td_profiler_event {
    const char *name;
    int64_t start_ns, end_ns;      /* CLOCK_MONOTONIC of the worker that recorded it */
    int64_t thread_id;             /* the recording thread's Linux thread id */
    int64_t node_id;               /* the recording worker's id; -1 when unknown (no RPC agent) */
    bool is_remote;                /* recorded by another worker and merged under an RPC's key */
    size_t num_inputs;             /* input shapes (record_shapes; 0 otherwise) */
    const td_shape *input_shapes;
    int64_t cpu_memory_usage;      /* bytes (profile_memory; 0 otherwise) */
} td_profiler_event;

/* Fills o with the defaults: nothing beyond names and times. */
TD_API void td_profiler_options_init(td_profiler_options *o);

/* Starts a profiler on the calling thread (o NULL: defaults); *p is the caller's handle. Fails
 * with TD_ERR_ALREADY, "Profiler is already enabled on this thread", while one runs here. */
TD_API td_status td_profiler_start(const td_profiler_options *o, td_profiler **p);
/* Stops recording; on the thread that started p only (TD_ERR_INVALID elsewhere, or when it is not
 * running). The events stay readable. */
TD_API td_status td_profiler_stop(td_profiler *p);
/* Drops the handle (stopping p first when it runs on this thread). NULL is ignored. */
TD_API void td_profiler_free(td_profiler *p);

/* A snapshot of the events, sorted by start time (an enclosing scope before what it encloses):
 * *events is an array of *n (free it with td_profiler_events_free; NULL when there is none). */
TD_API td_status td_profiler_events(td_profiler *p, td_profiler_event **events, size_t *n);
TD_API void td_profiler_events_free(td_profiler_event *events);

/* A user scope, as torch.autograd.profiler.record_function(name): enter opens it on this thread
 * (name is copied), exit closes the innermost one. Recorded when a profiler runs on this thread at
 * enter (or the thread serves a profiled call); otherwise they only keep the nesting. exit fails
 * with TD_ERR_INVALID when no scope is open. */
TD_API void td_record_function_enter(const char *name);
TD_API td_status td_record_function_exit(void);

/* Writes the events to path as a Chrome trace: a JSON array of complete events {"name", "ph":
 * "X", "ts", "dur" (microseconds), "pid" (the node id), "tid", "args"} and a process_name
 * entry naming each worker's track. */
TD_API td_status td_profiler_export_chrome_trace(td_profiler *p, const char *path);

#ifdef __cplusplus
}
#endif
#endif
