/* Internal: the objects of the local autograd (tdist/autograd.h) that its files share, and the
 * engine entry that distributed autograd will call.
 *
 * A tensor taking part in autograd carries an ag_meta (hung on td_tensor's `autograd` extension
 * slot, freed with the tensor): its .grad, its grad_fn (the node that produced it, and which of
 * that node's outputs it is) and, for a leaf, its AccumulateGrad node. Its requires_grad flag as a
 * leaf, its Parameter kind and whether it is a non-leaf live on the tensor itself
 * (td_tensor.grad_flags, tensor/strided.h), where mp reads and sets what travels between
 * processes; a leaf that arrived that way gets its ag_meta on first use. A node (td_autograd_node)
 * is refcounted; it holds references to the nodes its gradients go to (its next edges) and to the
 * tensors it saved for backward, which are data-only aliases (views without autograd metadata), so
 * the graph has no cycles: a tensor owns its grad_fn, never the other way round. An AccumulateGrad node reaches its leaf through an ag_weak box that the leaf's
 * metadata clears when the leaf goes. */
#ifndef TDIST_AUTOGRAD_IMPL_H
#define TDIST_AUTOGRAD_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <tdist/autograd.h>

#include "base/ref.h"
#include "tensor/strided.h"

/* A weak reference to a tensor: cleared (under lock) when the tensor goes. */
typedef struct ag_weak {
    td_ref refcount;
    pthread_mutex_t lock;
    td_tensor *tensor;
} ag_weak;

/* A new reference to the tensor, or NULL once it is gone. */
td_tensor *ag_weak_lock(ag_weak *w);
void ag_weak_release(ag_weak *w);

/* Where a gradient goes: input slot input_nr of node (NULL: nowhere, the input needs none). */
typedef struct ag_edge {
    td_autograd_node *node; /* retained */
    int input_nr;
} ag_edge;

/* What the gradient for one forward input must look like (PyTorch's InputMetadata). */
typedef struct ag_input_meta {
    td_dtype dtype;
    td_shape shape;
} ag_input_meta;

typedef struct ag_node_ops {
    const char *name;
    /* grads: the node's num_outputs incoming gradients (NULL entries only for nodes of several
     * outputs); writes num_next gradients (new references or NULL) into out. */
    td_status (*apply)(td_autograd_node *node, td_tensor *const *grads, td_tensor **out);
} ag_node_ops;

typedef enum ag_hook_kind { AG_HOOK_TENSOR, AG_HOOK_RETAIN_GRAD, AG_HOOK_POST_ACCUMULATE } ag_hook_kind;

/* Hooks form an append-only list per node (readers walk it without the lock); removal only marks
 * an entry, which is freed with the node. */
typedef struct ag_hook {
    struct ag_hook *_Atomic next;
    uint64_t handle;
    ag_hook_kind kind;
    int input_nr; /* tensor and retain-grad hooks: the node input whose gradient they see */
    atomic_bool removed;
    td_autograd_hook_fn fn;
    td_autograd_post_accumulate_fn post_fn;
    void *ctx;
    void (*ctx_free)(void *ctx);
    ag_weak *target; /* retain-grad: the non-leaf whose .grad it fills */
} ag_hook;

enum { AG_MAX_SAVED = 4 };

struct td_autograd_node {
    td_ref refcount;
    const ag_node_ops *ops;
    uint64_t sequence_nr; /* creation order; AccumulateGrad: UINT64_MAX (run as soon as ready) */
    int num_outputs;      /* gradients it receives (outputs of the forward) */
    int num_next;         /* gradients it produces (inputs of the forward) */
    ag_edge *next;        /* num_next entries, in the same allocation */
    ag_input_meta *input_meta;
    /* What the op saved for backward: data-only aliases, released by ag_node_release_saved. */
    td_tensor *saved[AG_MAX_SAVED];
    int num_saved;
    bool has_saved;
    atomic_bool saved_released;
    /* The op's arguments. */
    double scalar;
    int64_t ints[4];
    td_shape shape;
    /* Custom functions. */
    const td_autograd_function *custom;
    void *custom_ctx;
    /* AccumulateGrad: the leaf. */
    ag_weak *leaf;
    pthread_mutex_t hook_lock; /* appends to hooks */
    ag_hook *_Atomic hooks;
    struct td_autograd_node *free_next; /* the thread's list of nodes waiting to be freed */
};

typedef struct ag_meta {
    tensor_ext ext;
    pthread_mutex_t lock; /* grad, accumulator, weak */
    bool retains_grad;
    td_tensor *grad;
    td_autograd_node *grad_fn; /* retained; NULL for a leaf */
    int output_nr;
    td_autograd_node *accumulator; /* retained; a leaf's AccumulateGrad, made on first use */
    ag_weak *weak;
} ag_meta;

/* The metadata of t, NULL when it never took part in autograd. */
static inline ag_meta *ag_meta_of(const td_tensor *t)
{
    return (ag_meta *)__atomic_load_n(&t->autograd, __ATOMIC_ACQUIRE);
}
/* The metadata of t, attached if missing. */
ag_meta *ag_meta_get(td_tensor *t);
/* Whether grad mode is on in this thread. */
bool ag_grad_enabled(void);
/* Whether t requires grad (a leaf flagged, or a grad_fn). */
bool ag_requires_grad(const td_tensor *t);
/* The edge along which t receives its gradient: (grad_fn, output_nr) or (AccumulateGrad, 0) for
 * a leaf that requires grad, retained; a NULL node when t needs none. */
ag_edge ag_gradient_edge(td_tensor *t);
void ag_node_release(td_autograd_node *node);
td_autograd_node *ag_node_retain(td_autograd_node *node);
bool ag_node_is_accumulator(const td_autograd_node *node);
/* Frees the saved tensors (after a pass without retain_graph). */
void ag_node_release_saved(td_autograd_node *node);

/* The op-side recording: when grad mode is on and an input requires grad, a new node of ops with
 * edges to the n inputs (NULL entries allowed: no edge), made out's grad_fn; else NULL. The node
 * is borrowed (out's metadata owns it). */
td_autograd_node *ag_record(const ag_node_ops *ops, td_tensor *const *inputs, int n, td_tensor *out);
/* Saves a data-only alias of t in the node's next saved slot. */
void ag_save(td_autograd_node *node, const td_tensor *t);

/* Adds a gradient into a leaf's (or a retain-grad tensor's) .grad under its lock; takes grad. */
td_status ag_accumulate_grad(td_tensor *t, td_tensor *grad);
/* *slot += grad, in place when *slot is the engine's own; takes grad. */
td_status ag_buffer_add(td_tensor **slot, td_tensor *grad);

/* ---- backward kernels (kernels.c) --------------------------------------------------------- */

typedef enum ag_kernel {
    AG_KERNEL_RELU,    /* grad * (x > 0), x the relu's output */
    AG_KERNEL_TANH,    /* grad * (1 - x^2), x the tanh's output */
    AG_KERNEL_SIGMOID, /* grad * x * (1 - x), x the sigmoid's output */
    AG_KERNEL_POW_EXPONENT /* grad * y * log(x) (0 where x == 0 and y >= 0): x the base, y the output */
} ag_kernel;
/* Elementwise on grad's shape (x and y broadcast to it); the result has grad's dtype. */
td_status ag_pointwise_backward(ag_kernel kind, const td_tensor *grad, const td_tensor *x, const td_tensor *y,
                                td_tensor **out);
/* softmax / log_softmax backward from the forward's output y along dim. */
td_status ag_softmax_backward(const td_tensor *grad, const td_tensor *y, int dim, bool log_form, td_tensor **out);
/* The gradient of nll_loss with respect to its input (input's shape and dtype). */
td_status ag_nll_loss_backward(const td_tensor *grad, const td_tensor *input, const td_tensor *target,
                               td_loss_reduction reduction, int64_t ignore_index, td_tensor **out);
/* The dense gradient of embedding_bag with respect to weight. */
td_status ag_embedding_bag_backward(const td_tensor *grad, const td_tensor *weight, const td_tensor *indices,
                                    const td_tensor *offsets, td_embedding_bag_mode mode, td_tensor **out);

/* ---- the engine ---------------------------------------------------------------------------- */

/* One backward pass (a graph task): gradients grads[i] (taken) enter at roots[i]; the graph below
 * runs in dependency order on the calling thread. accumulate: AccumulateGrad nodes add into the
 * leaves' .grad (backward); otherwise they do not run (autograd.grad). captures[k] (may be NULL)
 * gets a new reference to the gradient arriving at capture_edges[k], or NULL if none does. This is
 * the entry distributed autograd runs per incoming gradient batch. */
typedef struct ag_task_spec {
    const ag_edge *roots;
    td_tensor **grads;
    int num_roots;
    bool retain_graph;
    bool accumulate;
    const ag_edge *capture_edges;
    td_tensor **captures;
    int num_captures;
} ag_task_spec;
td_status ag_engine_execute(const ag_task_spec *spec);

#endif
