/* The backward graph and the tensor side of autograd: each tensor's metadata (requires_grad, .grad,
 * grad_fn, its AccumulateGrad node), grad mode, graph nodes and their lifetime, recording an op's
 * node (ag_record, which every differentiable op in ops.c calls), gradient hooks, .grad
 * accumulation, and functions with a custom backward (td_autograd_function_record, which the RPC
 * send/recv functions of distributed autograd will use). engine.c runs the graphs built here.
 *
 * Lifetime: a tensor owns its metadata, the metadata owns the tensor's grad_fn (or AccumulateGrad),
 * a node owns the nodes it feeds and its saved aliases. Releasing a long chain's last tensor frees
 * the chain iteratively (node_free_pending), not by recursion, so deep graphs do not overflow the
 * stack. */
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "base/alloc.h"
#include "base/error.h"
#include "tensor/math.h"

/* ---- grad mode -------------------------------------------------------------------------------- */

static _Thread_local bool grad_disabled;

bool ag_grad_enabled(void) { return !grad_disabled; }
bool td_autograd_is_grad_enabled(void) { return !grad_disabled; }

bool td_autograd_set_grad_enabled(bool enabled)
{
    bool prev = !grad_disabled;
    grad_disabled = !enabled;
    return prev;
}

/* ---- weak references -------------------------------------------------------------------------- */

static ag_weak *weak_new(td_tensor *t)
{
    ag_weak *w = TD_NEW(ag_weak);
    ref_init(&w->refcount);
    pthread_mutex_init(&w->lock, NULL);
    w->tensor = t;
    return w;
}

td_tensor *ag_weak_lock(ag_weak *w)
{
    pthread_mutex_lock(&w->lock);
    td_tensor *t = w->tensor && ref_inc_not_zero(&w->tensor->refcount) ? w->tensor : NULL;
    pthread_mutex_unlock(&w->lock);
    return t;
}

void ag_weak_release(ag_weak *w)
{
    if (!w || !ref_dec(&w->refcount))
        return;
    pthread_mutex_destroy(&w->lock);
    free(w);
}

/* ---- nodes ------------------------------------------------------------------------------------ */

static atomic_uint_fast64_t next_sequence_nr;

static td_autograd_node *node_new(const ag_node_ops *ops, int num_outputs, int num_next)
{
    size_t extra = (size_t)num_next * (sizeof(ag_edge) + sizeof(ag_input_meta));
    td_autograd_node *n = alloc_zeroed(1, sizeof *n + extra);
    ref_init(&n->refcount);
    n->ops = ops;
    n->sequence_nr = atomic_fetch_add(&next_sequence_nr, 1);
    n->num_outputs = num_outputs;
    n->num_next = num_next;
    n->input_meta = (ag_input_meta *)(n + 1);
    n->next = (ag_edge *)(n->input_meta + num_next);
    pthread_mutex_init(&n->hook_lock, NULL);
    return n;
}

td_autograd_node *ag_node_retain(td_autograd_node *node)
{
    if (node)
        ref_inc(&node->refcount);
    return node;
}

void ag_node_release_saved(td_autograd_node *node)
{
    if (atomic_exchange(&node->saved_released, true))
        return;
    for (int i = 0; i < node->num_saved; i++) {
        td_tensor_release(node->saved[i]);
        node->saved[i] = NULL;
    }
    if (node->custom && node->custom->release_saved)
        node->custom->release_saved(node->custom_ctx);
}

/* Nodes whose count reached zero wait here to be freed by the outermost release on this thread. */
static _Thread_local td_autograd_node *pending_free;
static _Thread_local bool freeing;

static void node_free(td_autograd_node *n)
{
    for (int i = 0; i < n->num_saved; i++)
        td_tensor_release(n->saved[i]);
    if (n->custom) {
        if (n->custom->release_saved && !atomic_load(&n->saved_released))
            n->custom->release_saved(n->custom_ctx);
        if (n->custom->destroy)
            n->custom->destroy(n->custom_ctx);
    }
    ag_hook *h = atomic_load(&n->hooks);
    while (h) {
        ag_hook *next = atomic_load(&h->next);
        if (h->ctx_free)
            h->ctx_free(h->ctx);
        ag_weak_release(h->target);
        free(h);
        h = next;
    }
    ag_weak_release(n->leaf);
    pthread_mutex_destroy(&n->hook_lock);
    /* Queued, not freed here: the loop in ag_node_release frees them. */
    for (int i = 0; i < n->num_next; i++)
        ag_node_release(n->next[i].node);
    free(n);
}

void ag_node_release(td_autograd_node *node)
{
    if (!node || !ref_dec(&node->refcount))
        return;
    node->free_next = pending_free;
    pending_free = node;
    if (freeing)
        return;
    freeing = true;
    while (pending_free) {
        td_autograd_node *n = pending_free;
        pending_free = n->free_next;
        node_free(n);
    }
    freeing = false;
}

bool ag_node_is_accumulator(const td_autograd_node *node) { return node->leaf != NULL; }

const char *td_autograd_node_name(const td_autograd_node *node)
{
    if (!node)
        return "";
    return node->custom ? node->custom->name : node->ops->name;
}

int td_autograd_node_num_next(const td_autograd_node *node) { return node ? node->num_next : 0; }

td_autograd_node *td_autograd_node_next(const td_autograd_node *node, int i)
{
    return node && i >= 0 && i < node->num_next ? node->next[i].node : NULL;
}

/* ---- tensor metadata -------------------------------------------------------------------------- */

static void meta_free(tensor_ext *ext)
{
    ag_meta *m = (ag_meta *)ext;
    if (m->weak) {
        pthread_mutex_lock(&m->weak->lock);
        m->weak->tensor = NULL;
        pthread_mutex_unlock(&m->weak->lock);
        ag_weak_release(m->weak);
    }
    td_tensor_release(m->grad);
    ag_node_release(m->grad_fn);
    ag_node_release(m->accumulator);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

ag_meta *ag_meta_get(td_tensor *t)
{
    ag_meta *m = ag_meta_of(t);
    if (m)
        return m;
    m = TD_NEW(ag_meta);
    m->ext.free = meta_free;
    pthread_mutex_init(&m->lock, NULL);
    tensor_ext *expected = NULL;
    if (!__atomic_compare_exchange_n(&t->autograd, &expected, &m->ext, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        pthread_mutex_destroy(&m->lock);
        free(m);
        return (ag_meta *)expected;
    }
    return m;
}

bool ag_requires_grad(const td_tensor *t)
{
    return t && (tensor_grad_flags(t) & (TENSOR_REQUIRES_GRAD | TENSOR_NON_LEAF));
}

static ag_weak *meta_weak(ag_meta *m, td_tensor *t)
{
    pthread_mutex_lock(&m->lock);
    if (!m->weak)
        m->weak = weak_new(t);
    ref_inc(&m->weak->refcount);
    pthread_mutex_unlock(&m->lock);
    return m->weak;
}

static td_status accumulate_apply(td_autograd_node *node, td_tensor *const *grads, td_tensor **out);
static const ag_node_ops accumulate_ops = {"AccumulateGrad", accumulate_apply};

/* A leaf's AccumulateGrad, made on first use and kept for the leaf's lifetime (retained). */
static td_autograd_node *leaf_accumulator(td_tensor *t, ag_meta *m)
{
    ag_weak *w = meta_weak(m, t);
    pthread_mutex_lock(&m->lock);
    if (!m->accumulator) {
        td_autograd_node *n = node_new(&accumulate_ops, 1, 0);
        n->sequence_nr = UINT64_MAX;
        n->leaf = w;
        w = NULL;
        m->accumulator = n;
    }
    td_autograd_node *acc = ag_node_retain(m->accumulator);
    pthread_mutex_unlock(&m->lock);
    ag_weak_release(w);
    return acc;
}

ag_edge ag_gradient_edge(td_tensor *t)
{
    ag_meta *m = ag_meta_of(t);
    if (m && m->grad_fn)
        return (ag_edge){ag_node_retain(m->grad_fn), m->output_nr};
    /* A leaf that arrived from another process has the flag and no metadata yet. */
    if (tensor_grad_flags(t) & TENSOR_REQUIRES_GRAD)
        return (ag_edge){leaf_accumulator(t, ag_meta_get(t)), 0};
    return (ag_edge){NULL, 0};
}

/* ---- the public tensor API -------------------------------------------------------------------- */

td_status td_autograd_set_requires_grad(td_tensor *t, bool requires_grad)
{
    if (!t)
        return error_fmt(TD_ERR_INVALID, "td_autograd_set_requires_grad: t is NULL");
    ag_meta *m = ag_meta_of(t);
    if (m && m->grad_fn) {
        if (requires_grad)
            return TD_OK;
        return error_fmt(TD_ERR_INVALID, "you can only change requires_grad flags of leaf variables. If you want to "
                                         "use a computed variable in a subgraph that doesn't require differentiation "
                                         "use var_no_grad = var.detach().");
    }
    if (requires_grad && !td_dtype_is_floating(t->dtype) && !td_dtype_is_complex(t->dtype))
        return error_fmt(TD_ERR_INVALID, "only Tensors of floating point and complex dtype can require gradients");
    tensor_update_grad_flags(t, TENSOR_REQUIRES_GRAD, requires_grad);
    return TD_OK;
}

bool td_autograd_requires_grad(const td_tensor *t) { return ag_requires_grad(t); }

bool td_autograd_is_leaf(const td_tensor *t)
{
    ag_meta *m = t ? ag_meta_of(t) : NULL;
    return !m || !m->grad_fn;
}

td_tensor *td_autograd_get_grad(const td_tensor *t)
{
    ag_meta *m = t ? ag_meta_of(t) : NULL;
    if (!m)
        return NULL;
    pthread_mutex_lock(&m->lock);
    td_tensor *g = td_tensor_retain(m->grad);
    pthread_mutex_unlock(&m->lock);
    return g;
}

td_status td_autograd_set_grad(td_tensor *t, td_tensor *grad)
{
    if (!t)
        return error_fmt(TD_ERR_INVALID, "td_autograd_set_grad: t is NULL");
    if (grad && !strided_same_sizes(t, grad)) {
        char b1[256], b2[256];
        return error_fmt(TD_ERR_INVALID, "assigned grad has data of a different size: grad %s, tensor %s",
                         tensor_format_sizes(b1, sizeof b1, grad->ndim, grad->sizes),
                         tensor_format_sizes(b2, sizeof b2, t->ndim, t->sizes));
    }
    if (grad && grad->dtype != t->dtype)
        return error_fmt(TD_ERR_INVALID, "assigned grad has data of a different type");
    if (!grad && !ag_meta_of(t))
        return TD_OK;
    ag_meta *m = ag_meta_get(t);
    td_tensor_retain(grad);
    pthread_mutex_lock(&m->lock);
    td_tensor *old = m->grad;
    m->grad = grad;
    pthread_mutex_unlock(&m->lock);
    td_tensor_release(old);
    return TD_OK;
}

td_status td_autograd_detach(td_tensor *t, td_tensor **out)
{
    if (!t || !out)
        return error_fmt(TD_ERR_INVALID, "td_autograd_detach: %s is NULL", !t ? "t" : "out");
    *out = tensor_new_view(t, t->offset, t->ndim, t->sizes, t->strides);
    return TD_OK;
}

td_status td_autograd_parameter(td_tensor *data, bool requires_grad, td_tensor **out)
{
    if (!data || !out)
        return error_fmt(TD_ERR_INVALID, "td_autograd_parameter: %s is NULL", !data ? "data" : "out");
    *out = NULL;
    /* PyTorch's Parameter constructor passes requires_grad to the new tensor (AutogradMeta's
     * check, hence its capital "Only"), so an integer Parameter needs requires_grad=false. */
    if (requires_grad && !td_dtype_is_floating(data->dtype) && !td_dtype_is_complex(data->dtype))
        return error_fmt(TD_ERR_INVALID, "Only Tensors of floating point and complex dtype can require gradients");
    td_tensor *p = tensor_new_view(data, data->offset, data->ndim, data->sizes, data->strides);
    tensor_init_grad_flags(p, TENSOR_PARAMETER | (requires_grad ? TENSOR_REQUIRES_GRAD : 0u));
    *out = p;
    return TD_OK;
}

bool td_autograd_is_parameter(const td_tensor *t) { return t && (tensor_grad_flags(t) & TENSOR_PARAMETER); }

td_autograd_node *td_autograd_grad_fn(const td_tensor *t)
{
    ag_meta *m = t ? ag_meta_of(t) : NULL;
    return m ? m->grad_fn : NULL;
}

/* ---- recording -------------------------------------------------------------------------------- */

td_autograd_node *ag_record(const ag_node_ops *ops, td_tensor *const *inputs, int n, td_tensor *out)
{
    if (!ag_grad_enabled())
        return NULL;
    bool any = false;
    for (int i = 0; i < n && !any; i++)
        any = inputs[i] && ag_requires_grad(inputs[i]);
    if (!any)
        return NULL;
    td_autograd_node *node = node_new(ops, 1, n);
    for (int i = 0; i < n; i++) {
        if (!inputs[i])
            continue;
        node->next[i] = ag_gradient_edge(inputs[i]);
        node->input_meta[i] = (ag_input_meta){inputs[i]->dtype, td_tensor_shape(inputs[i])};
    }
    ag_meta *m = ag_meta_get(out);
    m->grad_fn = node;
    m->output_nr = 0;
    tensor_update_grad_flags(out, TENSOR_NON_LEAF, true);
    return node;
}

void ag_save(td_autograd_node *node, const td_tensor *t)
{
    bool plain = !ag_meta_of(t) && !tensor_grad_flags(t);
    td_tensor *alias = plain ? td_tensor_retain((td_tensor *)t)
                             : tensor_new_view(t, t->offset, t->ndim, t->sizes, t->strides);
    node->saved[node->num_saved++] = alias;
    node->has_saved = true;
}

/* ---- .grad accumulation ----------------------------------------------------------------------- */

/* Whether nobody but the holder of this one reference can see t's memory. */
static bool exclusive(const td_tensor *t)
{
    return !ag_meta_of(t) && !tensor_grad_flags(t) && ref_count((td_ref *)&t->refcount) == 1 &&
           ref_count(&t->storage->refcount) == 1;
}

/* dst += src in place when both are dense row-major of one dtype and shape; false otherwise. */
static bool add_into(td_tensor *dst, const td_tensor *src)
{
    if (dst->dtype != src->dtype || !strided_same_sizes(dst, src) || !td_tensor_is_contiguous(dst) ||
        !td_tensor_is_contiguous(src))
        return false;
    void *d = td_tensor_data(dst);
    return td_reduce(TD_SUM, dst->dtype, d, d, td_tensor_data(src), (size_t)td_tensor_numel(dst)) == TD_OK;
}

td_status ag_buffer_add(td_tensor **slot, td_tensor *grad)
{
    td_tensor *cur = *slot;
    if (!cur) {
        *slot = grad;
        return TD_OK;
    }
    if (exclusive(cur) && add_into(cur, grad)) {
        td_tensor_release(grad);
        return TD_OK;
    }
    if (exclusive(grad) && add_into(grad, cur)) {
        td_tensor_release(cur);
        *slot = grad;
        return TD_OK;
    }
    td_tensor *sum;
    td_status st = td_tensor_add(cur, grad, &sum);
    td_tensor_release(grad);
    if (st != TD_OK)
        return st;
    td_tensor_release(cur);
    *slot = sum;
    return TD_OK;
}

td_status ag_accumulate_grad(td_tensor *t, td_tensor *grad)
{
    ag_meta *m = ag_meta_get(t);
    td_status st = TD_OK;
    pthread_mutex_lock(&m->lock);
    if (!m->grad) {
        /* The pass's own dense gradient becomes .grad; anything else is copied (grad layout). */
        if (exclusive(grad) && td_tensor_is_contiguous(grad) && grad->dtype == t->dtype) {
            m->grad = grad;
            grad = NULL;
        } else {
            st = td_tensor_to(grad, t->dtype, &m->grad);
        }
    } else if (!add_into(m->grad, grad)) {
        td_tensor *sum;
        st = td_tensor_add(m->grad, grad, &sum);
        if (st == TD_OK) {
            st = td_tensor_copy(m->grad, sum);
            td_tensor_release(sum);
        }
    }
    pthread_mutex_unlock(&m->lock);
    td_tensor_release(grad);
    return st;
}

static td_status accumulate_apply(td_autograd_node *node, td_tensor *const *grads, td_tensor **out)
{
    (void)out;
    td_tensor *leaf = ag_weak_lock(node->leaf);
    if (!leaf)
        return TD_OK; /* the leaf is gone: nobody can see its gradient */
    td_status st = ag_accumulate_grad(leaf, td_tensor_retain(grads[0]));
    for (ag_hook *h = atomic_load(&node->hooks); h && st == TD_OK; h = atomic_load(&h->next)) {
        if (h->kind == AG_HOOK_POST_ACCUMULATE && !atomic_load(&h->removed))
            st = h->post_fn(leaf, h->ctx);
    }
    td_tensor_release(leaf);
    return st;
}

/* ---- hooks ------------------------------------------------------------------------------------ */

static atomic_uint_fast64_t next_hook_handle = 1;

static void node_add_hook(td_autograd_node *node, ag_hook *h)
{
    h->handle = atomic_fetch_add(&next_hook_handle, 1);
    pthread_mutex_lock(&node->hook_lock);
    ag_hook *_Atomic *tail = &node->hooks;
    while (atomic_load(tail))
        tail = &atomic_load(tail)->next;
    atomic_store(tail, h);
    pthread_mutex_unlock(&node->hook_lock);
}

/* The node t's hooks live on: its grad_fn, or its AccumulateGrad for a leaf (new reference). */
static td_status hook_node(td_tensor *t, td_autograd_node **node, int *input_nr)
{
    if (!t)
        return error_fmt(TD_ERR_INVALID, "cannot register a hook on a NULL tensor");
    if (!ag_requires_grad(t))
        return error_fmt(TD_ERR_INVALID, "cannot register a hook on a tensor that doesn't require gradient");
    ag_edge e = ag_gradient_edge(t);
    *node = e.node;
    *input_nr = e.input_nr;
    return TD_OK;
}

/* Adds the hook *tmpl (its kind and callback filled in) to t's node. */
static td_status add_hook(td_tensor *t, ag_hook tmpl, uint64_t *handle)
{
    td_autograd_node *node = NULL;
    int input_nr = 0;
    TD_TRY(hook_node(t, &node, &input_nr));
    ag_hook *h = TD_NEW(ag_hook);
    *h = tmpl;
    h->input_nr = input_nr;
    node_add_hook(node, h);
    if (handle)
        *handle = h->handle;
    ag_node_release(node);
    return TD_OK;
}

td_status td_autograd_register_hook(td_tensor *t, td_autograd_hook_fn fn, void *ctx, void (*ctx_free)(void *ctx),
                                    uint64_t *handle)
{
    if (!fn)
        return error_fmt(TD_ERR_INVALID, "td_autograd_register_hook: fn is NULL");
    return add_hook(t, (ag_hook){.kind = AG_HOOK_TENSOR, .fn = fn, .ctx = ctx, .ctx_free = ctx_free}, handle);
}

td_status td_autograd_register_post_accumulate_hook(td_tensor *t, td_autograd_post_accumulate_fn fn, void *ctx,
                                                    void (*ctx_free)(void *ctx), uint64_t *handle)
{
    if (!fn)
        return error_fmt(TD_ERR_INVALID, "td_autograd_register_post_accumulate_hook: fn is NULL");
    if (t && !td_autograd_is_leaf(t))
        return error_fmt(TD_ERR_INVALID, "post accumulate grad hooks cannot be registered on non-leaf tensors");
    return add_hook(t, (ag_hook){.kind = AG_HOOK_POST_ACCUMULATE, .post_fn = fn, .ctx = ctx, .ctx_free = ctx_free},
                    handle);
}

td_status td_autograd_remove_hook(td_tensor *t, uint64_t handle)
{
    td_autograd_node *node = NULL;
    if (t && ag_requires_grad(t)) {
        ag_edge e = ag_gradient_edge(t);
        node = e.node;
    }
    bool found = false;
    for (ag_hook *h = node ? atomic_load(&node->hooks) : NULL; h && !found; h = atomic_load(&h->next)) {
        if (h->handle == handle && h->kind != AG_HOOK_RETAIN_GRAD)
            found = !atomic_exchange(&h->removed, true);
    }
    ag_node_release(node);
    if (!found)
        return error_fmt(TD_ERR_INVALID, "td_autograd_remove_hook: the tensor has no hook with handle %llu",
                         (unsigned long long)handle);
    return TD_OK;
}

td_status td_autograd_retain_grad(td_tensor *t)
{
    if (!t || !ag_requires_grad(t))
        return error_fmt(TD_ERR_INVALID, "can't retain_grad on Tensor that has requires_grad=False");
    ag_meta *m = ag_meta_of(t);
    if (!m->grad_fn || m->retains_grad)
        return TD_OK; /* a leaf's .grad is kept anyway */
    ag_hook *h = TD_NEW(ag_hook);
    *h = (ag_hook){.kind = AG_HOOK_RETAIN_GRAD, .input_nr = m->output_nr, .target = meta_weak(m, t)};
    m->retains_grad = true;
    node_add_hook(m->grad_fn, h);
    return TD_OK;
}

/* ---- custom functions ------------------------------------------------------------------------- */

static td_status custom_apply(td_autograd_node *node, td_tensor *const *grads, td_tensor **out)
{
    return node->custom->backward(node->custom_ctx, grads, node->num_outputs, out, node->num_next);
}

static const ag_node_ops custom_ops = {"CustomFunction", custom_apply};

td_status td_autograd_function_record(const td_autograd_function *fn, void *ctx, td_tensor *const *inputs,
                                      int num_inputs, td_tensor *const *outputs, int num_outputs,
                                      td_autograd_node **node_out)
{
    if (node_out)
        *node_out = NULL;
    td_status st = TD_OK;
    if (!fn || !fn->backward || num_inputs < 0 || num_outputs < 1 || (num_inputs && !inputs) || !outputs)
        st = error_fmt(TD_ERR_INVALID, "td_autograd_function_record: needs a function with a backward, inputs and "
                                       "at least one output");
    for (int i = 0; st == TD_OK && i < num_outputs; i++) {
        if (!outputs[i] || ag_requires_grad(outputs[i]))
            st = error_fmt(TD_ERR_INVALID, "td_autograd_function_record: output %d is %s", i,
                           outputs[i] ? "already part of a graph (it requires grad)" : "NULL");
    }
    bool any = num_inputs == 0;
    for (int i = 0; i < num_inputs && !any; i++)
        any = inputs[i] && ag_requires_grad(inputs[i]);
    if (st != TD_OK || !any || !ag_grad_enabled()) {
        if (fn && fn->release_saved)
            fn->release_saved(ctx);
        if (fn && fn->destroy)
            fn->destroy(ctx);
        return st;
    }
    td_autograd_node *node = node_new(&custom_ops, num_outputs, num_inputs);
    node->custom = fn;
    node->custom_ctx = ctx;
    node->has_saved = fn->release_saved != NULL;
    for (int i = 0; i < num_inputs; i++) {
        if (!inputs[i])
            continue;
        node->next[i] = ag_gradient_edge(inputs[i]);
        node->input_meta[i] = (ag_input_meta){inputs[i]->dtype, td_tensor_shape(inputs[i])};
    }
    for (int i = 0; i < num_outputs; i++) {
        ag_meta *m = ag_meta_get(outputs[i]);
        m->grad_fn = i == 0 ? node : ag_node_retain(node);
        m->output_nr = i;
        tensor_update_grad_flags(outputs[i], TENSOR_NON_LEAF, true);
    }
    if (node_out)
        *node_out = node;
    return TD_OK;
}
