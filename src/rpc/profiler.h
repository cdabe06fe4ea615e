/* Internal: the RPC profiler's hooks (profiler.c) for the call path (agent.c) and the builtins
 * (builtins.c). tdist/profiler.h is the public side.
 *
 * A thread records into the profiler in rpc_prof_tls: a user's (td_profiler_start), or, on a pool
 * thread serving a call made under a profiler, the call's collector, whose events go back with
 * the reply. rpc_prof_recording counts the threads recording in this process, so that
 * rpc_prof_current costs one relaxed load while it is zero.
 *
 * Wire form (RPC_FLAG_PROFILING, docs/profiling.md): a profiled call's payload is the tuple
 * (call payload, config: int; bit 0 record_shapes, bit 1 profile_memory); its reply's payload,
 * with the flag set on the reply too, is (value, events), events a list of tuples (name: str,
 * start_ns, end_ns, thread_id, node_id: int, is_remote: bool, input shapes: list of tuples of
 * ints, cpu_memory_usage: int). An error reply carries no events. */
#ifndef TDIST_RPC_PROFILER_H
#define TDIST_RPC_PROFILER_H

#include <stdatomic.h>
#include <stdint.h>

#include <tdist/profiler.h>
#include <tdist/rpc.h>
#include <tdist/value.h>

typedef enum rpc_prof_mode { RPC_PROF_SYNC, RPC_PROF_ASYNC, RPC_PROF_REMOTE } rpc_prof_mode;

extern atomic_int rpc_prof_recording;
extern _Thread_local td_profiler *rpc_prof_tls;

/* The profiler this thread records into, or NULL. */
static inline td_profiler *rpc_prof_current(void)
{
    if (__builtin_expect(atomic_load_explicit(&rpc_prof_recording, memory_order_relaxed) == 0, 1))
        return NULL;
    return rpc_prof_tls;
}

td_profiler *rpc_prof_retain(td_profiler *p);
void rpc_prof_release(td_profiler *p);

/* ---- the caller's side -------------------------------------------------------------------------- */

/* One profiled call in flight: its event's key and start, and the profiler it ends in. */
typedef struct rpc_prof_call rpc_prof_call;

/* Starts the event of a call of fn from caller to callee in p (from rpc_prof_current); NULL for
 * the RRef protocol's bookkeeping calls (fork, accept, delete) and the group's join and leave,
 * which PyTorch sends outside its profiler too. */
rpc_prof_call *rpc_prof_call_begin(td_profiler *p, rpc_prof_mode mode, const char *fn, const td_worker_info *caller,
                                   const td_worker_info *callee);
/* The payload to send for a profiled call: (payload, config), a new reference (payload borrowed). */
td_value *rpc_prof_call_wrap(const rpc_prof_call *c, const td_value *payload);
/* A profiled call's reply (value, events): merges the events under c's key (c may be NULL: they are
 * dropped) and replaces *v (taken) by the value (NULL for None). Fails on a malformed reply. */
td_status rpc_prof_reply_unwrap(rpc_prof_call *c, td_value **v);
/* Ends c's event now and frees c; NULL is ignored. */
void rpc_prof_call_end(rpc_prof_call *c);
/* Frees c without recording (the call never went out). NULL is ignored. */
void rpc_prof_call_discard(rpc_prof_call *c);

/* ---- the callee's side -------------------------------------------------------------------------- */

/* Splits a profiled call's payload: *call (borrowed from payload) is the call's own payload, and
 * *collector (a new reference) the profiler that records what serving it does, as worker self. */
td_status rpc_prof_serve_parts(const td_value *payload, int64_t self, const td_value **call, td_profiler **collector);
/* Makes collector this thread's profiler while the function runs; returns the previous one, for
 * rpc_prof_serve_exit. */
td_profiler *rpc_prof_serve_enter(td_profiler *collector);
void rpc_prof_serve_exit(td_profiler *previous);
/* The reply's payload (value, events): a new reference; value borrowed, NULL for None. */
td_value *rpc_prof_reply_wrap(td_profiler *collector, const td_value *value);

/* ---- builtins ----------------------------------------------------------------------------------- */

/* Records builtin `name` that ran from start_ns to now in p: its positional inputs' shapes
 * (record_shapes) and its tensor result's bytes (profile_memory; result may be NULL). */
void rpc_prof_record_op(td_profiler *p, const char *name, int64_t start_ns, const td_value *args,
                        const td_value *result);

#endif
