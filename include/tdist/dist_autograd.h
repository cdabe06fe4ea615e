/* tdist/dist_autograd.h: distributed autograd over RPC (torch.distributed.autograd, FAST mode).
 *
 * A context groups the RPCs of one forward and the backward that follows. While a thread is in a
 * context, every td_rpc_sync/async/remote it makes carries the context's id; the argument tensors
 * that require grad get a "send" function on the caller and arrive on the callee as outputs of a
 * "recv" function, so the callee's computation on them is recorded; results that require grad come
 * back the same way. The callee runs the function inside the same context (its own copy, made on
 * first use), so nested calls are recorded too.
 *
 * td_dist_autograd_backward runs the local graph from the roots; each recv function it reaches sends
 * its gradient to the worker that sent the tensor, which runs its graph from the matching send
 * function (once per incoming gradient batch) and so on. Gradients of each worker's leaves
 * accumulate in that worker's copy of the context, not in .grad: read them with
 * td_dist_autograd_get_gradients on the worker owning the leaves. The call returns when every
 * worker's part is done, with the first error any of them met (a lost worker: TD_ERR_PEER_LOST,
 * naming it).
 *
 * Context ids are worker_id << 48 | a counter. An unknown id fails with "Could not find autograd
 * context with id: N". Leaving a context releases it on this worker and on every worker it reached.
 * Arguments are borrowed; tensors returned are new references.
 */
#ifndef TDIST_DIST_AUTOGRAD_H
#define TDIST_DIST_AUTOGRAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/rpc.h>
#include <tdist/rref.h>
#include <tdist/status.h>
#include <tdist/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a context on agent (NULL: the default agent) and makes it this thread's current one
 * (dist_autograd.context().__enter__). Fails with "Already have an autograd context id for this
 * thread." while the thread is in one. */
TD_API td_status td_dist_autograd_context_enter(td_rpc_agent *agent, int64_t *context_id);
/* Leaves and releases the context: here, and on every worker that took part in it (their copies
 * are gone when this returns; workers that cannot be reached are skipped). It stops being this
 * thread's current context. */
TD_API td_status td_dist_autograd_context_exit(int64_t context_id);
/* This thread's current context id, or -1 when there is none. */
TD_API int64_t td_dist_autograd_current_context(void);

/* dist_autograd.backward(context_id, roots, retain_graph): roots are n scalar tensors that require
 * grad ("element 0 of tensors does not require grad and does not have a grad_fn", "grad can be
 * implicitly created only for scalar outputs"), seeded with 1. Without retain_graph the graph is
 * freed as it runs, on every worker. */
TD_API td_status td_dist_autograd_backward(int64_t context_id, td_tensor *const *roots, int n, bool retain_graph);

/* The gradient accumulated for leaf t in the context on this worker: *grad is a new reference, or
 * NULL when no gradient reached t. */
TD_API td_status td_dist_autograd_get_gradient(int64_t context_id, const td_tensor *t, td_tensor **grad);
/* dist_autograd.get_gradients: the context's leaves on this worker and their gradients, pairwise,
 * up to cap of each into tensors and grads (new references; either may be NULL to count only);
 * *n is the total number. */
TD_API td_status td_dist_autograd_get_gradients(int64_t context_id, td_tensor **tensors, td_tensor **grads,
                                                size_t cap, size_t *n);

/* RRef.backward(dist_autograd_ctx_id, retain_graph): the backward from the scalar tensor an RRef
 * holds. On the owner, context_id -1 runs the local backward (td_autograd_backward: gradients in
 * .grad); any other id runs td_dist_autograd_backward in that context. A user RRef needs a context
 * ("User RRefs require 'dist_autograd_ctx_id' to be specified") and asks the owner to run the
 * distributed backward there (the context exists on the owner when the value was computed in it),
 * waiting for it and failing as it failed. A value that is not a tensor fails with "RRef should
 * contain a tensor for .backward()". rref is borrowed. */
TD_API td_status td_rref_backward(td_rref *rref, int64_t context_id, bool retain_graph);

#ifdef __cplusplus
}
#endif
#endif
