/* tdist/rref.h: remote references (torch.distributed.rpc.RRef in C).
 *
 * An RRef names a value that lives on one worker, its owner. td_rpc_remote asks a worker to run a
 * function and keep the result; it returns at once with an RRef whose owner is that worker. The
 * owner holds the value; every other worker holding the RRef is a user, with a reference it can
 * pass on (as an argument or a result of any call, nested in lists, tuples, dicts and records),
 * fetch a copy through (td_rref_to_here) or call methods through (td_rref_rpc_sync and friends).
 *
 * References are counted across workers as PyTorch counts them: each user reference is a fork
 * with an id of its own, confirmed by the owner before a function that received it runs; a user
 * that passes its reference on keeps it until the receiver is confirmed, so a delete never
 * overtakes a fork; the owner frees the value when the last fork is deleted. In C, Python's
 * garbage collection becomes td_rref_release: when a worker's last reference to a user RRef goes,
 * the owner is told (asynchronously). A graceful shutdown first deletes the user RRefs still held,
 * then checks that no owner still has forks: "Leaking RRef <id> with fork Id <id>" is an error when
 * td_rpc_options.ignore_rref_leak is false, a warning otherwise (the default, as in PyTorch).
 *
 * Ids are GloballyUniqueId(created_on, local_id): the creating worker's id and a counter of that
 * agent shared by RRef and fork ids, from 0 (td_rpc_remote takes the RRef id before the fork id).
 *
 * Types: an RRef's type is its value's type name: "Tensor", "int", "float", "bool", "str",
 * "bytes", "complex", "NoneType", "list", "tuple", "dict", "WorkerInfo", "RRef", or for a record
 * the name registered for its tag (td_rpc_register_type; "object" otherwise). Methods are
 * functions registered for a type name (td_rpc_register_method): the proxies call them on the
 * owner with the owner's value as the first argument, which may be changed in place (a record's
 * fields) to keep state on the owner. The library registers Tensor's size, add and view.
 *
 * Every function here takes the agent the RRef belongs to from the RRef; NULL for an agent means
 * the default agent (tdist/rpc.h). After the agent shut down, using an RRef fails with "RPC has not
 * been initialized..." and releasing it is safe. */
#ifndef TDIST_RREF_H
#define TDIST_RREF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/future.h>
#include <tdist/rpc.h>
#include <tdist/status.h>
#include <tdist/value.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_rref td_rref;

/* ---- creating and dropping ------------------------------------------------------------------- */

/* Runs fn(args, kwargs) on worker `to`, which keeps the result, and returns at once (*rref: a new
 * reference). Argument errors return here, as for td_rpc_async. A failure of the function, of the
 * owner or a timeout (timeout_ms as for calls) does not fail this call: it fails the RRef's
 * creation future (td_rref_get_future), and to_here and the type query then fail with it; after a
 * timeout with "RRef creation via rpc.remote() timed out, and it is possible that the RRef on the
 * owner node does not exist.". To oneself, this worker is the owner. */
TD_API td_status td_rpc_remote(td_rpc_agent *agent, td_rpc_dest to, const char *fn, const td_value *args,
                               const td_value *kwargs, int64_t timeout_ms, td_rref **rref);
/* An RRef of value (retained) owned by this worker; no message is sent. */
TD_API td_status td_rref_create(td_rpc_agent *agent, td_value *value, td_rref **rref);
TD_API td_rref *td_rref_retain(td_rref *r);
/* Drops a reference; the last one of a user RRef tells its owner. NULL is ignored. */
TD_API void td_rref_release(td_rref *r);

/* ---- as values ------------------------------------------------------------------------------- */

/* A value holding r (a new reference to the value, which holds a reference to r): pass it in the
 * arguments or result of any call, or keep it in containers. */
TD_API td_value *td_rref_value(td_rref *r);
/* The RRef a value holds (borrowed; valid while v is), or NULL if v is not one. */
TD_API td_rref *td_value_get_rref(const td_value *v);

/* ---- queries --------------------------------------------------------------------------------- */

TD_API bool td_rref_is_owner(const td_rref *r);
TD_API td_status td_rref_owner(const td_rref *r, td_worker_info *owner);
/* Whether the owner confirmed this reference (always true on the owner). */
TD_API bool td_rref_confirmed_by_owner(const td_rref *r);
/* "OwnerRRef(GloballyUniqueId(created_on=0, local_id=0))" or "UserRRef(RRefId =
 * GloballyUniqueId(created_on=0, local_id=1), ForkId = GloballyUniqueId(created_on=0, local_id=2))",
 * truncated to size. Returns the full length. */
TD_API size_t td_rref_to_string(const td_rref *r, char *buf, size_t size);
/* The creation future (a new reference): completed when the owner holds the value (with None),
 * failed when the creation failed. Completed at once for td_rref_create and on a received RRef. */
TD_API td_future *td_rref_get_future(td_rref *r);

/* ---- the value ------------------------------------------------------------------------------- */

/* A copy of the value, fetched from the owner (on the owner: the value itself, retained), waiting
 * for its creation; timeout_ms as for calls. *value: a new reference, NULL for None. */
TD_API td_status td_rref_to_here(td_rref *r, int64_t timeout_ms, td_value **value);
/* The owner's value (a new reference to it, not a copy). On a user fails with "For
 * UserRRef(rref_id=..., fork_id=...), can't call localValue() on user WorkerInfo(id=1,
 * name=worker1). Call it on owner WorkerInfo(id=2, name=worker2)". */
TD_API td_status td_rref_local_value(td_rref *r, td_value **value);

/* The value's type name (borrowed; valid while r is). The first query of a user asks the owner
 * once (an RPC to "_rref_typeof_on_owner", waiting for the creation); the answer is cached, a
 * failure is not. async returns the same future (a new reference) on every call until it fails;
 * its value is the name as a string. */
TD_API td_status td_rref_get_type(td_rref *r, int64_t timeout_ms, const char **type_name);
TD_API td_future *td_rref_get_type_async(td_rref *r, int64_t timeout_ms);

/* ---- methods on the owner -------------------------------------------------------------------- */

/* Names a record tag's type for type queries and method lookup (TD_ERR_ALREADY if the tag has
 * another name). */
TD_API td_status td_rpc_register_type(uint32_t record_tag, const char *type_name);
/* Registers fn as method `method` of type type_name: a function (tdist/rpc.h) whose first argument
 * is the owner's value. Fails with TD_ERR_ALREADY when taken. */
TD_API td_status td_rpc_register_method(const char *type_name, const char *method, td_rpc_fn fn, void *arg);
TD_API td_status td_rpc_register_method_async(const char *type_name, const char *method, td_rpc_async_fn fn,
                                              void *arg);
/* The type name of a value as above ("Tensor", "int", ...); the string is static or registered. */
TD_API const char *td_rpc_type_name(const td_value *v);

/* Proxies: call method on the owner's value, as rref.rpc_sync().method(*args), rpc_async() and
 * remote(). The method is looked up here first, against the RRef's type (td_rref_get_type): a
 * missing one fails with AttributeError "type object 'T' has no attribute 'm'" at once for sync
 * and remote, through the future for async. */
TD_API td_status td_rref_rpc_sync(td_rref *r, const char *method, const td_value *args, const td_value *kwargs,
                                  int64_t timeout_ms, td_value **result);
TD_API td_status td_rref_rpc_async(td_rref *r, const char *method, const td_value *args, const td_value *kwargs,
                                   int64_t timeout_ms, td_future **future);
TD_API td_status td_rref_remote(td_rref *r, const char *method, const td_value *args, const td_value *kwargs,
                                int64_t timeout_ms, td_rref **out);

#ifdef __cplusplus
}
#endif
#endif
