/* tdist/rpc.h: remote procedure calls between named workers (torch.distributed.rpc in C).
 *
 * A worker is an RPC agent (td_rpc_agent) with a name unique in its world ("worker0") and an id
 * (its rank). Agents meet through a store (tdist/store.h), given explicitly or through an
 * init_method URL, exactly as process groups do. Every agent serves calls on a pool of threads
 * while its own threads make calls: a worker may call a worker that is calling it, and chains of
 * calls across three workers never deadlock.
 *
 * Functions are C functions registered by name in the process (td_rpc_register), the same names in
 * every worker, as Python finds a function by its module and name. A call names the function and
 * passes positional and keyword arguments as td_values (tdist/value.h); the callee's function
 * returns a td_value or fails. Values are copied on the way, also on a call to oneself. The library
 * registers builtin tensor functions ("aten::add", "aten::mul", ...; docs/rpc.md lists them).
 *
 * Destinations are given by name, by id (rank) or by a worker info; td_rpc_dest builds each.
 *
 * Timeouts are int64 milliseconds, PyTorch's convention: TD_RPC_DEFAULT_TIMEOUT (-1) means the
 * agent's default (60 s unless set), 0 means no timeout. A call that passes its timeout fails with
 * "RPC ran for more than set timeout (N ms) and will now be marked with an error"; a reply that
 * comes later is dropped.
 *
 * Errors: a function that fails on the callee fails the caller's call with TD_ERR_REMOTE, a
 * message naming the callee and the original error, and the error's type name
 * (td_future_error_type): "ValueError" and "TypeError" kept, every other type given as
 * "RuntimeError" with the original type in the message. Argument and encoding errors are returned
 * at the call site, before anything is sent. A worker that dies fails every call waiting on it, on
 * every worker, with TD_ERR_PEER_LOST naming it, within seconds.
 *
 * A process may host several agents (tests do); the default agent (td_rpc_init /
 * td_rpc_shutdown) is a convenience over them: wherever a function takes an agent, NULL means the
 * default agent, and fails with "RPC has not been initialized. Call torch.distributed.rpc.init_rpc
 * first." when there is none.
 */
#ifndef TDIST_RPC_H
#define TDIST_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/future.h>
#include <tdist/status.h>
#include <tdist/value.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef TD_STORE_DECLARED /* declared by store.h, pg.h and rpc.h: C99 allows one typedef */
#define TD_STORE_DECLARED
typedef struct td_store td_store;
#endif
typedef struct td_rpc_agent td_rpc_agent;
/* The call a function is serving (its caller, its agent); valid while the function runs. */
typedef struct td_rpc_call td_rpc_call;

#define TD_RPC_DEFAULT_TIMEOUT (-1)
#define TD_RPC_NO_TIMEOUT 0
#define TD_RPC_MAX_NAME 128 /* a name is 1..127 characters of [A-Za-z0-9-_:] */

/* ---- agents ------------------------------------------------------------------------------------ */

typedef struct td_rpc_options {
    const char *init_method;   /* env:// (NULL), tcp://host:port or file://path; unused with store */
    td_store *store;           /* where the agents meet (borrowed; retained by the agent), or NULL */
    int64_t rpc_timeout_ms;    /* the default timeout of calls: 60000; 0: none */
    int num_worker_threads;    /* threads serving calls: 16 (more are started for handlers that block) */
    bool tcp_only;             /* reach same-host workers over TCP too (benchmarks and tests) */
    const char *listen_host;   /* address to listen on and publish; NULL: 127.0.0.1, or every
                                * interface (publishing the host name) when TDIST_SOCKET_IFNAME is
                                * set or MASTER_ADDR is not a loopback address */
    bool ignore_rref_leak;     /* true (default): RRefs still forked at graceful shutdown are logged;
                                * false: the shutdown fails with "Leaking RRef ..." (tdist/rref.h) */
} td_rpc_options;

/* Fills o with the defaults above. */
TD_API void td_rpc_options_init(td_rpc_options *o);

/* Starts an agent named name with id rank among world_size workers, and returns once every
 * worker of the world has joined. world_size < 0 joins a dynamic group instead, as worker rank
 * (required, below 1024; the group meets through o->store or an init_method without a world
 * size): it returns once every current member knows it, and its graceful shutdown is a leave (the
 * others drop it). A group is either static or dynamic; a worker of the other kind fails with "RPC
 * group mixes statically and dynamically initialized members which is not supported. ..."
 * (docs/rpc.md). o may be NULL (defaults). Fails with PyTorch's messages on a bad name ("Worker
 * name must match ..."), a name already taken ("RPC worker name X is not unique. ..."), or when
 * the world does not meet within the timeout. */
TD_API td_status td_rpc_agent_create(const char *name, int rank, int world_size, const td_rpc_options *o,
                                     td_rpc_agent **agent);
/* Stops the agent and frees it, whatever the outcome. graceful: first waits, with every worker,
 * until no worker has calls in flight (timeout_ms, 0: no limit; in a dynamic group: until this
 * worker has none, then it leaves the group), and returns that phase's error if it fails; then,
 * graceful or not, fails the calls still pending, stops serving and closes its connections. Not
 * from a function the agent runs nor from a future callback (shutdown waits for them): that fails
 * with TD_ERR_INVALID and the agent keeps running. */
TD_API td_status td_rpc_agent_shutdown(td_rpc_agent *agent, bool graceful, int64_t timeout_ms);

/* The default agent. init fails with "RPC is already initialized" while one runs (which keeps
 * running); shutdown with "RPC has not been initialized..." when none does. After shutdown, init
 * may run again. */
TD_API td_status td_rpc_init(const char *name, int rank, int world_size, const td_rpc_options *o);
TD_API td_status td_rpc_shutdown(bool graceful, int64_t timeout_ms);

/* The default timeout of calls (ms; 0: none). get returns -1 when there is no such agent. */
TD_API td_status td_rpc_set_timeout(td_rpc_agent *agent, int64_t timeout_ms);
TD_API int64_t td_rpc_get_timeout(td_rpc_agent *agent);

/* ---- workers ----------------------------------------------------------------------------------- */

typedef struct td_worker_info {
    char name[TD_RPC_MAX_NAME];
    int64_t id;
} td_worker_info;

/* Checks name and fills *info; fails with "Worker name must match ^[A-Za-z0-9-_:]*$, and must be
 * non-empty and shorter than 128 chars, but got <name>". */
TD_API td_status td_worker_info_make(const char *name, int64_t id, td_worker_info *info);
TD_API bool td_worker_info_equal(const td_worker_info *a, const td_worker_info *b);
/* As a value (TD_REC_WORKER_INFO), and back. */
TD_API td_value *td_worker_info_value(const td_worker_info *info);
TD_API td_status td_worker_info_from_value(const td_value *v, td_worker_info *info);

/* This worker (name NULL) or the one named. */
TD_API td_status td_rpc_worker_info(td_rpc_agent *agent, const char *name, td_worker_info *info);
TD_API td_status td_rpc_worker_info_by_id(td_rpc_agent *agent, int64_t id, td_worker_info *info);
/* Every worker known now, by id: up to cap into infos, the count into *n. */
TD_API td_status td_rpc_worker_infos(td_rpc_agent *agent, td_worker_info *infos, size_t cap, size_t *n);

/* Where a call goes: a worker name, an id, a worker info, or a td_value holding any of these (a
 * string, an int, a TD_REC_WORKER_INFO record; anything else fails as PyTorch's ValueError,
 * "Cannot get WorkerInfo from name 1.5"). Unknown workers fail with "... could not find
 * destination ...". */
typedef enum td_rpc_dest_kind { TD_RPC_DEST_NAME, TD_RPC_DEST_ID, TD_RPC_DEST_INFO, TD_RPC_DEST_VALUE } td_rpc_dest_kind;
typedef struct td_rpc_dest {
    td_rpc_dest_kind kind;
    const char *name;       /* NAME */
    int64_t id;             /* ID */
    td_worker_info info;    /* INFO */
    const td_value *value;  /* VALUE (borrowed) */
} td_rpc_dest;

static inline td_rpc_dest td_rpc_to_name(const char *name)
{
    td_rpc_dest d = {TD_RPC_DEST_NAME, name, 0, {{0}, 0}, NULL};
    return d;
}
static inline td_rpc_dest td_rpc_to_id(int64_t id)
{
    td_rpc_dest d = {TD_RPC_DEST_ID, NULL, id, {{0}, 0}, NULL};
    return d;
}
static inline td_rpc_dest td_rpc_to_info(const td_worker_info *info)
{
    td_rpc_dest d = {TD_RPC_DEST_INFO, NULL, 0, *info, NULL};
    return d;
}
static inline td_rpc_dest td_rpc_to_value(const td_value *value)
{
    td_rpc_dest d = {TD_RPC_DEST_VALUE, NULL, 0, {{0}, 0}, value};
    return d;
}

/* ---- functions --------------------------------------------------------------------------------- */

/* A function as workers call it. args is a tuple (never NULL), kwargs a dict of string keys
 * (never NULL); both are borrowed. It sets *result (a new reference; NULL means None) and returns
 * TD_OK, or fails: with td_rpc_raise for a typed error, or with any td_status and td_last_error()
 * as the message (a RuntimeError on the caller). It runs on one of the agent's pool threads and
 * may make calls of its own. */
typedef td_status (*td_rpc_fn)(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result);
/* An asynchronous function: returns a future (a new reference) whose completion is the call's
 * reply, sent when it completes without holding a pool thread meanwhile; NULL fails the call
 * (td_rpc_raise or td_last_error as above). */
typedef td_future *(*td_rpc_async_fn)(td_rpc_call *call, const td_value *args, const td_value *kwargs);

/* Registers a function under name, in this process, for every agent; arg is given back by
 * td_rpc_call_arg. Fails with TD_ERR_ALREADY when the name is taken. */
TD_API td_status td_rpc_register(const char *name, td_rpc_fn fn, void *arg);
TD_API td_status td_rpc_register_async(const char *name, td_rpc_async_fn fn, void *arg);
/* Removes a registered function; TD_ERR_NOT_FOUND if none has that name. */
TD_API td_status td_rpc_unregister(const char *name);

/* Fails the running function with an error of the given Python type name ("ValueError",
 * "TypeError", "AttributeError", or any other): sets td_last_error() and returns TD_ERR_REMOTE
 * for the function to return. */
TD_API td_status td_rpc_raise(const char *type_name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Binds args and kwargs to parameters as Python does: params is "a,b,c" (a trailing "=x" gives
 * a default of None: "a,b,c=x" makes c optional); out[i] is parameter i (borrowed; NULL for an
 * absent optional one). Too many, too few, unknown or doubled arguments fail with a TypeError as
 * Python words it ("my_function() missing 1 required positional argument: 'c'"). */
TD_API td_status td_rpc_bind(const char *function, const char *params, const td_value *args, const td_value *kwargs,
                             const td_value **out);

/* The running call's agent, caller, and the arg given at registration. */
TD_API td_rpc_agent *td_rpc_call_agent(const td_rpc_call *call);
TD_API const td_worker_info *td_rpc_call_caller(const td_rpc_call *call);
TD_API void *td_rpc_call_arg(const td_rpc_call *call);

/* ---- calls ------------------------------------------------------------------------------------- */

/* Calls function fn on worker to with args (a tuple or list; NULL: none) and kwargs (a dict of
 * string keys; NULL: none), both borrowed and copied before the call returns. sync waits for the
 * result (*result: a new reference, NULL for None); async returns a future (*future: a new
 * reference) completed with the result. */
TD_API td_status td_rpc_sync(td_rpc_agent *agent, td_rpc_dest to, const char *fn, const td_value *args,
                             const td_value *kwargs, int64_t timeout_ms, td_value **result);
TD_API td_status td_rpc_async(td_rpc_agent *agent, td_rpc_dest to, const char *fn, const td_value *args,
                              const td_value *kwargs, int64_t timeout_ms, td_future **future);

/* ---- among workers ----------------------------------------------------------------------------- */

/* Every named worker (names NULL: all) contributes value (borrowed); *gathered (a new reference)
 * is a dict of name to value, the same on each. Concurrent calls over the same set pair up in
 * order (a sequence number per sorted set of names). The values meet in the agents' store, not
 * at a leader worker as in PyTorch; a timeout fails with "Workers of {...} timed out in
 * _all_gather after N seconds". */
TD_API td_status td_rpc_all_gather(td_rpc_agent *agent, const td_value *value, const char *const *names, size_t n,
                                   int64_t timeout_ms, td_value **gathered);
/* Returns once every named worker (names NULL: all) has called it. */
TD_API td_status td_rpc_barrier(td_rpc_agent *agent, const char *const *names, size_t n, int64_t timeout_ms);

/* The agent's state as a dict of string to string (a new reference): docs/rpc.md lists the keys. */
TD_API td_status td_rpc_debug_info(td_rpc_agent *agent, td_value **info);

#ifdef __cplusplus
}
#endif
#endif
