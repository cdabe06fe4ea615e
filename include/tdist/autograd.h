/* tdist/autograd.h: reverse-mode automatic differentiation over td_tensor (torch.autograd).
 *
 * Any floating td_tensor can require grad: td_autograd_set_requires_grad(w, true) makes w a leaf
 * that collects gradients. The differentiable ops below (td_autograd_add, td_autograd_mm, ...)
 * compute what their td_tensor_* counterparts compute and, when grad mode is on and an input
 * requires grad, record a node of the backward graph as the result's grad_fn. td_autograd_backward
 * then runs that graph from a root in dependency order and accumulates each leaf's gradient into
 * its .grad (td_autograd_get_grad). As in PyTorch:
 *
 *   td_autograd_set_requires_grad(w, true);
 *   td_autograd_mm(x, w, &y);  td_autograd_sum(y, &loss);
 *   td_autograd_backward(loss, NULL, false);      // w's .grad is now x^T @ ones
 *
 * Ownership follows tensor.h: ops return new references; arguments are borrowed. The graph keeps
 * what it needs alive (a non-leaf holds its grad_fn, a node holds the nodes it feeds and the
 * tensors it saved), and a backward without retain_graph frees the saved tensors, so a second
 * backward through the same nodes fails with PyTorch's message. A leaf's .grad is accumulated in
 * place once it exists (its identity stays, as DDP's buckets want).
 *
 * Threads: grad mode is per thread. Backward passes run on the calling thread; passes over
 * different graphs run concurrently from different threads, and passes that share leaves
 * accumulate into their .grad under the leaf's lock.
 *
 * Across processes (tdist/mp.h queues and spawn arguments) a tensor keeps its data (shared), its
 * requires_grad and its kind (plain or Parameter); its .grad, hooks and graph stay behind, and a
 * non-leaf that requires grad is refused at send time (send its td_autograd_detach instead).
 *
 * Not here yet: gradients of gradients (create_graph), in-place ops and their version checks,
 * sparse gradients, forward-mode AD, anomaly detection. */
#ifndef TDIST_AUTOGRAD_H
#define TDIST_AUTOGRAD_H

#include <stdbool.h>
#include <stdint.h>

#include <tdist/status.h>
#include <tdist/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tensors that require grad -------------------------------------------------------------- */

/* requires_grad_(): makes t a leaf that requires grad (or no longer does). Integer and bool
 * tensors cannot ("only Tensors of floating point and complex dtype can require gradients"; the
 * ops differentiate floating dtypes only); a non-leaf can only be set
 * to true ("you can only change requires_grad flags of leaf variables. If you want to use a
 * computed variable in a subgraph that doesn't require differentiation use var_no_grad =
 * var.detach()."). */
TD_API td_status td_autograd_set_requires_grad(td_tensor *t, bool requires_grad);
/* True for a leaf set to require grad and for every result of a recorded op. */
TD_API bool td_autograd_requires_grad(const td_tensor *t);
/* True unless t was produced by a recorded op (has a grad_fn), as torch's is_leaf. */
TD_API bool td_autograd_is_leaf(const td_tensor *t);
/* .grad: a new reference to t's accumulated gradient, or NULL when it has none. */
TD_API td_tensor *td_autograd_get_grad(const td_tensor *t);
/* Sets .grad (NULL clears it, as zero_grad(set_to_none=True)); grad is retained and must have t's
 * shape. Later backward passes accumulate into it in place. */
TD_API td_status td_autograd_set_grad(td_tensor *t, td_tensor *grad);
/* retain_grad(): a non-leaf that requires grad also gets its .grad filled by backward passes. */
TD_API td_status td_autograd_retain_grad(td_tensor *t);
/* detach(): a new tensor on t's storage that is a leaf not requiring grad. */
TD_API td_status td_autograd_detach(td_tensor *t, td_tensor **out);
/* nn.Parameter(data, requires_grad): a new leaf on data's storage (data's view, without its .grad
 * or graph) whose kind is Parameter. An integer or bool Parameter must pass requires_grad=false
 * ("Only Tensors of floating point and complex dtype can require gradients"). Results of ops on a
 * Parameter, its views and detach() are plain tensors; td_autograd_set_requires_grad keeps the
 * kind. */
TD_API td_status td_autograd_parameter(td_tensor *data, bool requires_grad, td_tensor **out);
/* type(t) is Parameter. */
TD_API bool td_autograd_is_parameter(const td_tensor *t);

/* ---- grad mode ------------------------------------------------------------------------------ */

/* torch.set_grad_enabled for the calling thread; returns the previous setting. With grad mode
 * off, ops record nothing and their results do not require grad (torch.no_grad). */
TD_API bool td_autograd_set_grad_enabled(bool enabled);
TD_API bool td_autograd_is_grad_enabled(void);
/* A no-grad scope: TD_NO_GRAD { ... } (do not leave it by return, break or goto). */
#define TD_NO_GRAD                                                                          \
    for (int td_ng_once_ = 1, td_ng_prev_ = td_autograd_set_grad_enabled(false); td_ng_once_; \
         td_ng_once_ = 0, td_autograd_set_grad_enabled(td_ng_prev_ != 0))

/* ---- backward ------------------------------------------------------------------------------- */

/* tensor.backward(gradient, retain_graph): gradient may be NULL for a one-element tensor (then 1).
 * Errors: "element 0 of tensors does not require grad and does not have a grad_fn", "grad can be
 * implicitly created only for scalar outputs", "Mismatch in shape: grad_output[0] has a shape of
 * [2] and output[0] has a shape of [3].", and a second pass through freed nodes: "Trying to
 * backward through the graph a second time (...). Specify retain_graph=True if you need to
 * backward through the graph a second time or if you need to access saved tensors after calling
 * backward." */
TD_API td_status td_autograd_backward(td_tensor *tensor, td_tensor *gradient, bool retain_graph);
/* torch.autograd.backward(tensors, grad_tensors): n roots in one pass; grads may be NULL (all
 * implicit) or hold NULL entries. */
TD_API td_status td_autograd_backward_many(td_tensor *const *tensors, td_tensor *const *grads, int n,
                                           bool retain_graph);
/* torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph, allow_unused): the gradients
 * of the outputs with respect to each input, into grads_out[i] (new references), without touching
 * any .grad. An input the outputs do not depend on fails ("One of the differentiated Tensors
 * appears to not have been used in the graph. Set allow_unused=True if this is the desired
 * behavior.") unless allow_unused, which gives NULL. */
TD_API td_status td_autograd_grad(td_tensor *const *outputs, td_tensor *const *grad_outputs, int n_outputs,
                                  td_tensor *const *inputs, int n_inputs, bool retain_graph, bool allow_unused,
                                  td_tensor **grads_out);

/* ---- graph nodes and hooks ------------------------------------------------------------------ */

typedef struct td_autograd_node td_autograd_node;

/* grad_fn: t's node (borrowed, valid while t lives), NULL for a leaf. */
TD_API td_autograd_node *td_autograd_grad_fn(const td_tensor *t);
/* The node's class name, as PyTorch prints it: "AddBackward0", "MmBackward0", "AccumulateGrad". */
TD_API const char *td_autograd_node_name(const td_autograd_node *node);
/* The nodes it sends gradients to (next_functions): NULL for an input that needs none. */
TD_API int td_autograd_node_num_next(const td_autograd_node *node);
TD_API td_autograd_node *td_autograd_node_next(const td_autograd_node *node, int i);

/* A hook on t's gradient (tensor.register_hook): called with the gradient flowing into t before
 * it is used (before accumulation for a leaf). Set *replace to a new reference to use another
 * gradient instead (same shape); leave it NULL to keep grad. A failure aborts the pass with its
 * status and message. Hooks run in registration order, each seeing the previous one's result. */
typedef td_status (*td_autograd_hook_fn)(td_tensor *grad, void *ctx, td_tensor **replace);
/* A hook after a leaf's .grad was accumulated (register_post_accumulate_grad_hook, DDP's trigger):
 * leaf is the tensor whose td_autograd_get_grad is now up to date. */
typedef td_status (*td_autograd_post_accumulate_fn)(td_tensor *leaf, void *ctx);

/* Registration returns a handle for removal in *handle (may be NULL); ctx_free (may be NULL) runs
 * on ctx when the node the hook lives on goes (t's grad_fn, or a leaf's AccumulateGrad, which lives
 * as long as the leaf), removed or not: removal only stops the calls. t must require grad ("cannot
 * register a hook on a tensor that doesn't require gradient"); post-accumulate hooks need a leaf
 * ("post accumulate grad hooks cannot be registered on non-leaf tensors"). */
TD_API td_status td_autograd_register_hook(td_tensor *t, td_autograd_hook_fn fn, void *ctx,
                                           void (*ctx_free)(void *ctx), uint64_t *handle);
TD_API td_status td_autograd_register_post_accumulate_hook(td_tensor *t, td_autograd_post_accumulate_fn fn,
                                                           void *ctx, void (*ctx_free)(void *ctx),
                                                           uint64_t *handle);
/* Removes a hook of either kind from t; TD_ERR_INVALID when t has no hook with that handle. */
TD_API td_status td_autograd_remove_hook(td_tensor *t, uint64_t handle);

/* ---- functions with a custom backward (torch.autograd.Function) ---------------------------- */

typedef struct td_autograd_function {
    const char *name; /* the node's name ("MyFunctionBackward") */
    /* grad_outputs[i] is the gradient of forward output i (NULL when none reached it: a zero).
     * Fill grad_inputs[j] with a new reference to the gradient of input j, or leave it NULL for
     * none. Gradients of another dtype are converted and of a broadcastable shape summed to the
     * input's (as PyTorch's engine does). */
    td_status (*backward)(void *ctx, td_tensor *const *grad_outputs, int num_outputs, td_tensor **grad_inputs,
                          int num_inputs);
    /* Frees what ctx saved for backward; called after a pass without retain_graph (and before
     * destroy). May be NULL; when set, a pass after it fails with PyTorch's second-backward
     * message. */
    void (*release_saved)(void *ctx);
    void (*destroy)(void *ctx); /* when the node goes; may be NULL */
} td_autograd_function;

/* Records a node for a forward the caller computed: outputs (which must be fresh, non-leaf-free
 * results: tensors without a grad_fn that do not require grad) become its outputs and get it as
 * grad_fn. Nothing is recorded (and destroy runs on ctx at once) when grad mode is off or no input
 * requires grad, except that a function with no inputs is always recorded (a gradient source, as
 * RPC's receive functions are). fn must outlive the node. *node_out (may be NULL) is the node,
 * borrowed, or NULL when nothing was recorded. */
TD_API td_status td_autograd_function_record(const td_autograd_function *fn, void *ctx, td_tensor *const *inputs,
                                             int num_inputs, td_tensor *const *outputs, int num_outputs,
                                             td_autograd_node **node_out);

/* ---- differentiable ops --------------------------------------------------------------------- *
 * Each computes its tensor.h counterpart (same results, dtypes and errors) and records a node when
 * grad mode is on and an input requires grad. Gradients are defined for floating dtypes; binary
 * ops broadcast, and their gradients are summed back to each input's shape. */
TD_API td_status td_autograd_add(td_tensor *a, td_tensor *b, td_tensor **out);
TD_API td_status td_autograd_sub(td_tensor *a, td_tensor *b, td_tensor **out);
TD_API td_status td_autograd_mul(td_tensor *a, td_tensor *b, td_tensor **out);
TD_API td_status td_autograd_div(td_tensor *a, td_tensor *b, td_tensor **out);
TD_API td_status td_autograd_add_scalar(td_tensor *a, double b, td_tensor **out);
TD_API td_status td_autograd_mul_scalar(td_tensor *a, double b, td_tensor **out);
TD_API td_status td_autograd_neg(td_tensor *a, td_tensor **out);
TD_API td_status td_autograd_pow(td_tensor *a, td_tensor *exponent, td_tensor **out);
TD_API td_status td_autograd_pow_scalar(td_tensor *a, double exponent, td_tensor **out);
TD_API td_status td_autograd_exp(td_tensor *a, td_tensor **out);
TD_API td_status td_autograd_log(td_tensor *a, td_tensor **out);
TD_API td_status td_autograd_relu(td_tensor *a, td_tensor **out);
TD_API td_status td_autograd_tanh(td_tensor *a, td_tensor **out);
TD_API td_status td_autograd_sigmoid(td_tensor *a, td_tensor **out);
/* matmul for 1-D and 2-D operands (dot, mv, vector-matrix, mm); mm; addmm = bias + a @ b. */
TD_API td_status td_autograd_matmul(td_tensor *a, td_tensor *b, td_tensor **out);
TD_API td_status td_autograd_mm(td_tensor *a, td_tensor *b, td_tensor **out);
TD_API td_status td_autograd_addmm(td_tensor *bias, td_tensor *a, td_tensor *b, td_tensor **out);
/* sum / mean of every element (0-dim) and over one dim. */
TD_API td_status td_autograd_sum(td_tensor *a, td_tensor **out);
TD_API td_status td_autograd_sum_dim(td_tensor *a, int dim, bool keepdim, td_tensor **out);
TD_API td_status td_autograd_mean(td_tensor *a, td_tensor **out);
TD_API td_status td_autograd_mean_dim(td_tensor *a, int dim, bool keepdim, td_tensor **out);
TD_API td_status td_autograd_softmax(td_tensor *a, int dim, td_tensor **out);
TD_API td_status td_autograd_log_softmax(td_tensor *a, int dim, td_tensor **out);
/* Losses: input [N, C] (or [C]), target int64 [N] (or 0-dim); see td_tensor_nll_loss.
 * cross_entropy is log_softmax over the class dim followed by nll_loss. ignore_index: torch's
 * default is -100. */
TD_API td_status td_autograd_nll_loss(td_tensor *input, td_tensor *target, td_loss_reduction reduction,
                                      int64_t ignore_index, td_tensor **out);
TD_API td_status td_autograd_cross_entropy(td_tensor *input, td_tensor *target, td_loss_reduction reduction,
                                           int64_t ignore_index, td_tensor **out);
/* Shape ops; view and reshape return views when tensor.h does (the gradient flows either way). */
TD_API td_status td_autograd_reshape(td_tensor *a, td_shape shape, td_tensor **out);
TD_API td_status td_autograd_view(td_tensor *a, td_shape shape, td_tensor **out);
TD_API td_status td_autograd_transpose(td_tensor *a, int dim0, int dim1, td_tensor **out);
TD_API td_status td_autograd_narrow(td_tensor *a, int dim, int64_t start, int64_t length, td_tensor **out);
TD_API td_status td_autograd_cat(td_tensor *const *tensors, int n, int dim, td_tensor **out);
/* embedding_bag (sum and mean); the gradient flows to weight only (indices are integers). */
TD_API td_status td_autograd_embedding_bag(td_tensor *weight, td_tensor *indices, td_tensor *offsets,
                                           td_embedding_bag_mode mode, td_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
