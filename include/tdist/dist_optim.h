/* tdist/dist_optim.h: the DistributedOptimizer (torch.distributed.optim.DistributedOptimizer).
 *
 * A DistributedOptimizer holds RRefs to parameters (leaf tensors that require grad) living on any
 * workers. td_dist_optimizer_step(opt, context_id) asks every owner, concurrently, to update its
 * parameters in place with their gradients in that distributed autograd context
 * (td_dist_autograd_get_gradient on the owner; a parameter with no gradient there is skipped, as a
 * parameter whose .grad is None). Each owner keeps, per DistributedOptimizer, a local optimizer with
 * the per-parameter state (momentum buffers, Adam's moments and step count), made on the first step
 * (PyTorch's _LocalOptimizer) and dropped by td_dist_optimizer_free.
 *
 * The updates are PyTorch's torch.optim.SGD and torch.optim.Adam (foreach=False, maximize=False,
 * amsgrad=False), computed in double precision and stored in the parameter's dtype (float32 or
 * float64, contiguous):
 *   SGD:  g += weight_decay * p; buf = g on the first step, else momentum * buf + (1 - dampening) * g;
 *         g = nesterov ? g + momentum * buf : buf (only when momentum != 0); p -= lr * g.
 *   Adam: t += 1; g += weight_decay * p; m = beta1 * m + (1 - beta1) * g;
 *         v = beta2 * v + (1 - beta2) * g * g;
 *         p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
 * Arguments are borrowed; the optimizer keeps its own references to the RRefs. */
#ifndef TDIST_DIST_OPTIM_H
#define TDIST_DIST_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/rref.h>
#include <tdist/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum td_optim_kind { TD_OPTIM_SGD = 0, TD_OPTIM_ADAM = 1 } td_optim_kind;

/* The hyperparameters; each kind reads its own. td_optim_options_default gives PyTorch's defaults. */
typedef struct td_optim_options {
    double lr;           /* both; SGD's and Adam's default 1e-3 */
    double momentum;     /* SGD; 0 */
    double dampening;    /* SGD; 0 */
    bool nesterov;       /* SGD; needs momentum > 0 and dampening 0 */
    double weight_decay; /* both; 0 */
    double betas[2];     /* Adam; (0.9, 0.999) */
    double eps;          /* Adam; 1e-8 */
} td_optim_options;

typedef struct td_dist_optimizer td_dist_optimizer;

TD_API td_optim_options td_optim_options_default(void);

/* DistributedOptimizer(optimizer_class, params_rref, **options): checks the options with PyTorch's
 * messages ("Invalid learning rate: -1", "Invalid momentum value: -1", "Invalid weight_decay value:
 * -1", "Nesterov momentum requires a momentum and zero dampening", "Invalid epsilon value: -1",
 * "Invalid beta parameter at index 0: 1") and keeps the n RRefs (all of one agent). Nothing is sent
 * yet. */
TD_API td_status td_dist_optimizer_create(td_optim_kind kind, const td_optim_options *options,
                                          td_rref *const *params, size_t n, td_dist_optimizer **opt);
/* One step in context_id: an RPC to each owner, all in flight at once, then waits for all; fails
 * with the first failure (every owner's call is waited for). A parameter RRef whose value is not a
 * tensor that requires grad fails the step on its owner. */
TD_API td_status td_dist_optimizer_step(td_dist_optimizer *opt, int64_t context_id);
/* The learning rate of the following steps on every owner (each step carries it), as a scheduler
 * sets param_group["lr"]: "Invalid learning rate: -1" for a negative or NaN lr. td_dist_optimizer_lr
 * reads it back (0 for NULL). */
TD_API td_status td_dist_optimizer_set_lr(td_dist_optimizer *opt, double lr);
TD_API double td_dist_optimizer_lr(const td_dist_optimizer *opt);
/* Drops the owners' local optimizers (an RPC to each owner, waited for; owners
 * that cannot be reached are skipped) and the RRefs. NULL is ignored. Free it before the agent
 * shuts down. */
TD_API void td_dist_optimizer_free(td_dist_optimizer *opt);

#ifdef __cplusplus
}
#endif
#endif
