/* Internal: what distributed autograd (dist_autograd.c) offers the rest of src/autograd (the
 * DistributedOptimizer in dist_optim.c). */
#ifndef TDIST_AUTOGRAD_DIST_AUTOGRAD_IMPL_H
#define TDIST_AUTOGRAD_DIST_AUTOGRAD_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include <tdist/future.h>
#include <tdist/rpc.h>
#include <tdist/tensor.h>
#include <tdist/value.h>

/* td_dist_autograd_get_gradient on agent a's copy of the context (a process may host several
 * agents, each with its copy). */
td_status dist_ag_gradient_on(td_rpc_agent *a, int64_t context_id, const td_tensor *t, td_tensor **grad);
/* An internal call to worker peer on a's call path with the default timeout, carrying no autograd
 * context even when this thread is in one. */
td_status dist_ag_call_plain(td_rpc_agent *a, int peer, const char *fn, const td_value *args, td_future **future);
/* Registers the DistributedOptimizer's internal functions (dist_optim.c); called once, with
 * distributed autograd's, when the first agent is made, so that every owner serves them. */
void dist_optim_register_functions(void);
/* Drops the local optimizers agent a served (its agent_free hook: a trainer that never freed its
 * DistributedOptimizer leaves them behind). */
void dist_optim_agent_free(td_rpc_agent *a);
/* The local optimizers this process holds, over all its agents (a test hook: none are left once
 * every DistributedOptimizer was freed). */
size_t dist_optim_local_count(void);

#endif
