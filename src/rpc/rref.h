/* Internal: the RRef context of an agent (rref.c), the agent's hooks into it, and test hooks.
 *
 * Every RRef value crossing the wire passes through rpc_rref_send (before encoding: forks the
 * RRefs it holds for the receiver) and rpc_rref_receive (after decoding: turns the wire records
 * into live RRefs and starts their confirmation). The protocol's messages are calls of internal
 * functions ("tdist::rref_*", "_rref_typeof_on_owner") through the agent's one call path, so
 * timeouts, failures and graceful shutdown's count of calls in flight cover them too. */
#ifndef TDIST_RPC_RREF_H
#define TDIST_RPC_RREF_H

#include <stdbool.h>
#include <stdint.h>

#include <tdist/future.h>
#include <tdist/rref.h>
#include <tdist/value.h>

#include "rpc/message.h"

typedef struct rpc_rref_ctx rpc_rref_ctx;

rpc_rref_ctx *rpc_rref_ctx_new(void);
/* At the agent's teardown: drops every RRef the context holds (owners, pending users and children),
 * breaking the cycles between RRefs and their agent. */
void rpc_rref_ctx_clear(td_rpc_agent *a);
void rpc_rref_ctx_free(rpc_rref_ctx *c);

/* Before sending v to worker `to`: *out is v with each RRef replaced by its wire record, forked for
 * `to` (v itself, retained, when it holds none). */
td_status rpc_rref_send(td_rpc_agent *a, int to, const td_value *v, td_value **out);
/* After decoding v from worker `from`: *out is v with each wire record replaced by a live RRef (v,
 * retained, when it holds none). When confirm is non-NULL it gets a future (or NULL) that completes
 * once every user RRef created here is confirmed by its owner: a call runs after it. */
td_status rpc_rref_receive(td_rpc_agent *a, int from, const td_value *v, td_value **out, td_future **confirm);
/* A remote call (td_rpc_remote: RPC_FLAG_RREF, the header's rref_* and fork_* ids) arrived from
 * caller: on the I/O thread, in the order of the channel, so that the caller's later delete finds
 * the fork it registers (a remote to oneself registers none). Returns the owner RRef the result
 * goes to (a reference; NULL once the agent is torn down). */
td_rref *rpc_rref_remote_arrived(td_rpc_agent *a, int caller, const rpc_header *h);
/* The remote call's function finished with value (taken: a future of its result or error): owner
 * (taken; may be NULL) takes it. Returns the future to reply with (a new reference): None once the
 * value is set, or the function's error. */
td_future *rpc_rref_remote_result(td_rref *owner, td_future *value);
/* Graceful shutdown, after the first round (every worker finished its work): waits for pending
 * users and children to settle, then sends the deletes of every user RRef still held and drops
 * owner RRefs never forked. */
void rpc_rref_shutdown_users(td_rpc_agent *a, int64_t deadline_ns);
/* Worker peer was lost: the forks sent to it will never be accepted, so the pending children
 * waiting for them are dropped (shutdown would wait for them). */
void rpc_rref_peer_lost(td_rpc_agent *a, int peer);
/* After the last round: fails (leak check on) or logs each fork still held on this owner. */
td_status rpc_rref_leak_check(td_rpc_agent *a, bool ignore);
/* The debug-info keys: num_owner_rrefs, num_pending_futures, num_pending_users, num_forks. */
void rpc_rref_debug_info(td_rpc_agent *a, td_value *dict);

/* The agent r belongs to (borrowed; r holds a reference). */
td_rpc_agent *rpc_rref_agent(const td_rref *r);

/* Test hooks: skip the user deletes of graceful shutdown (the seed's test_rref_leak mocks them
 * out); the number of type queries this agent sent to owners. */
void rpc_rref_testing_skip_user_deletes(td_rpc_agent *a, bool skip);
uint64_t rpc_rref_testing_type_queries(td_rpc_agent *a);

#endif
