/* The backward engine: runs one graph task (a backward pass from given root gradients) on the
 * calling thread, as PyTorch's engine runs CPU work on the thread that called backward().
 *
 * A pass first walks the graph from the roots and counts, for every node reachable, how many edges
 * lead into it (its dependencies). Gradients then flow from the roots: a node runs once all its
 * dependencies have delivered (their gradients summed in its input buffer), picked from a ready
 * heap by descending sequence number, as torch's ready queue orders them, so AccumulateGrad nodes
 * (UINT64_MAX) run as soon as they are ready and later ops before earlier ones. Running a node is:
 * its tensor hooks (which may replace a gradient), retain-grad hooks, captures (for
 * autograd.grad), then the node's backward, then (without retain_graph) the release of what it
 * saved. Each gradient it produces is checked against what its input looked like in the forward
 * (converted to the input's dtype, summed down to its shape when broadcast) and added into the
 * next node's buffer: in place when the buffer holds the engine's own tensor.
 *
 * The per-pass tables (node -> slot hash, buffers, heap, walk stack) live in a per-thread
 * workspace that is reused from pass to pass, so a warm pass allocates only the gradient tensors
 * themselves. Nothing is shared between passes but the graph, which is read-only here except for
 * the saved tensors a pass frees and the leaves' .grad, which ag_accumulate_grad updates under the
 * leaf's lock: passes over different graphs run concurrently from different threads. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "base/alloc.h"
#include "base/error.h"
#include "tensor/math.h"

/* ---- the per-thread workspace ----------------------------------------------------------------- */

typedef struct task_slot {
    td_autograd_node *node; /* NULL: empty; borrowed (the roots keep the graph alive) */
    int deps;
    int buf; /* index of its first input buffer entry in ws->bufs */
} task_slot;

typedef struct workspace {
    task_slot *slots; /* open addressing, capacity a power of two */
    size_t cap, used;
    int *heap; /* slot indices */
    int heap_len, heap_cap;
    td_tensor **bufs;
    int bufs_len, bufs_cap;
    td_autograd_node **stack;
    int stack_cap;
    td_tensor **outs;
    int outs_cap;
} workspace;

static pthread_key_t ws_key;
static pthread_once_t ws_once = PTHREAD_ONCE_INIT;

static void ws_free(void *p)
{
    workspace *ws = p;
    if (!ws)
        return;
    free(ws->slots);
    free(ws->heap);
    free(ws->bufs);
    free(ws->stack);
    free(ws->outs);
    free(ws);
}

static void ws_key_init(void) { pthread_key_create(&ws_key, ws_free); }

/* This thread's workspace, taken out of the thread's slot while a pass uses it: a hook that runs a
 * nested backward on the same thread gets a fresh one. */
static workspace *ws_acquire(void)
{
    pthread_once(&ws_once, ws_key_init);
    workspace *ws = pthread_getspecific(ws_key);
    if (ws) {
        pthread_setspecific(ws_key, NULL);
        return ws;
    }
    return TD_NEW(workspace);
}

static void ws_return(workspace *ws)
{
    if (ws->used)
        memset(ws->slots, 0, sizeof(task_slot) * ws->cap);
    ws->used = 0;
    ws->heap_len = ws->bufs_len = 0;
    if (pthread_getspecific(ws_key))
        ws_free(ws); /* a nested pass's: the outer one keeps the thread's */
    else
        pthread_setspecific(ws_key, ws);
}

static size_t hash_ptr(const void *p, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
    return (size_t)(x >> 17) & (cap - 1);
}

static void grow_array(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return;
    int n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    *arr = alloc_resize(*arr, (size_t)n * elem);
    *cap = n;
}

static void slots_rehash(workspace *ws, size_t cap)
{
    task_slot *old = ws->slots;
    size_t old_cap = ws->cap;
    ws->slots = TD_NEW_ARRAY(task_slot, cap);
    ws->cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i].node)
            continue;
        size_t j = hash_ptr(old[i].node, cap);
        while (ws->slots[j].node)
            j = (j + 1) & (cap - 1);
        ws->slots[j] = old[i];
    }
    free(old);
}

/* The slot of node, added (with its input buffers) when new; *added says which. */
static int slot_of(workspace *ws, td_autograd_node *node, bool *added)
{
    if ((ws->used + 1) * 2 > ws->cap)
        slots_rehash(ws, ws->cap ? ws->cap * 2 : 256);
    size_t j = hash_ptr(node, ws->cap);
    while (ws->slots[j].node && ws->slots[j].node != node)
        j = (j + 1) & (ws->cap - 1);
    *added = !ws->slots[j].node;
    if (*added) {
        grow_array((void **)&ws->bufs, &ws->bufs_cap, ws->bufs_len + node->num_outputs, sizeof(td_tensor *));
        ws->slots[j] = (task_slot){.node = node, .buf = ws->bufs_len};
        memset(ws->bufs + ws->bufs_len, 0, sizeof(td_tensor *) * (size_t)node->num_outputs);
        ws->bufs_len += node->num_outputs;
        ws->used++;
    }
    return (int)j;
}

static int slot_find(const workspace *ws, const td_autograd_node *node)
{
    size_t j = hash_ptr(node, ws->cap);
    while (ws->slots[j].node != node)
        j = (j + 1) & (ws->cap - 1);
    return (int)j;
}

/* ---- the ready heap (max sequence number first) ----------------------------------------------- */

static uint64_t seq_of(const workspace *ws, int s) { return ws->slots[s].node->sequence_nr; }

static void heap_push(workspace *ws, int s)
{
    grow_array((void **)&ws->heap, &ws->heap_cap, ws->heap_len + 1, sizeof(int));
    int i = ws->heap_len++;
    while (i > 0 && seq_of(ws, ws->heap[(i - 1) / 2]) < seq_of(ws, s)) {
        ws->heap[i] = ws->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    ws->heap[i] = s;
}

static int heap_pop(workspace *ws)
{
    int top = ws->heap[0], last = ws->heap[--ws->heap_len], i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= ws->heap_len)
            break;
        if (c + 1 < ws->heap_len && seq_of(ws, ws->heap[c + 1]) > seq_of(ws, ws->heap[c]))
            c++;
        if (seq_of(ws, ws->heap[c]) <= seq_of(ws, last))
            break;
        ws->heap[i] = ws->heap[c];
        i = c;
    }
    if (ws->heap_len)
        ws->heap[i] = last;
    return top;
}

/* ---- running one node ------------------------------------------------------------------------- */

static const char second_backward_message[] =
    "Trying to backward through the graph a second time (or directly access saved tensors after they have "
    "already been freed). Saved intermediate values of the graph are freed when you call .backward() or "
    "autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if "
    "you need to access saved tensors after calling backward.";

static td_status run_hooks(td_autograd_node *node, td_tensor **grads)
{
    for (ag_hook *h = atomic_load(&node->hooks); h; h = atomic_load(&h->next)) {
        if (h->kind != AG_HOOK_TENSOR || atomic_load(&h->removed) || !grads[h->input_nr])
            continue;
        td_tensor *replace = NULL;
        TD_TRY(h->fn(grads[h->input_nr], h->ctx, &replace));
        if (replace) {
            td_tensor_release(grads[h->input_nr]);
            grads[h->input_nr] = replace;
        }
    }
    for (ag_hook *h = atomic_load(&node->hooks); h; h = atomic_load(&h->next)) {
        if (h->kind != AG_HOOK_RETAIN_GRAD || !grads[h->input_nr])
            continue;
        td_tensor *t = ag_weak_lock(h->target);
        if (t) {
            td_status st = ag_accumulate_grad(t, td_tensor_retain(grads[h->input_nr]));
            td_tensor_release(t);
            TD_TRY(st);
        }
    }
    return TD_OK;
}

static td_status run_node(const ag_task_spec *spec, td_autograd_node *node, td_tensor **grads, td_tensor **outs)
{
    TD_TRY(run_hooks(node, grads));
    for (int k = 0; k < spec->num_captures; k++) {
        const ag_edge *e = &spec->capture_edges[k];
        if (e->node == node && grads[e->input_nr] && !spec->captures[k])
            spec->captures[k] = td_tensor_retain(grads[e->input_nr]);
    }
    if (ag_node_is_accumulator(node))
        return spec->accumulate ? node->ops->apply(node, grads, outs) : TD_OK;
    bool any = false;
    for (int i = 0; i < node->num_outputs && !any; i++)
        any = grads[i] != NULL;
    if (!any)
        return TD_OK; /* nothing reached it: nothing flows on */
    if (node->has_saved && atomic_load(&node->saved_released))
        return error_fmt(TD_ERR_INVALID, "%s", second_backward_message);
    td_status st = node->ops->apply(node, grads, outs);
    if (st != TD_OK)
        return error_prefix(st, "in %s", td_autograd_node_name(node));
    return TD_OK;
}

/* A produced gradient made to fit the forward input it belongs to (PyTorch's validate_outputs). */
static td_status fit_gradient(const td_autograd_node *node, int j, td_tensor **g)
{
    const ag_input_meta *m = &node->input_meta[j];
    td_tensor *cur = *g, *fixed;
    td_shape shape = td_tensor_shape(cur);
    bool same = shape.ndim == m->shape.ndim && memcmp(shape.d, m->shape.d, sizeof(int64_t) * (size_t)shape.ndim) == 0;
    if (!same) {
        td_status st = td_tensor_sum_to_size(cur, m->shape, &fixed);
        if (st != TD_OK) {
            char b1[256], b2[256];
            return error_fmt(TD_ERR_INVALID,
                             "Function %s returned an invalid gradient at index %d - got %s but expected shape "
                             "compatible with %s",
                             td_autograd_node_name(node), j, tensor_format_sizes(b1, sizeof b1, shape.ndim, shape.d),
                             tensor_format_sizes(b2, sizeof b2, m->shape.ndim, m->shape.d));
        }
        td_tensor_release(cur);
        *g = cur = fixed;
    }
    if (cur->dtype != m->dtype) {
        TD_TRY(td_tensor_to(cur, m->dtype, &fixed));
        td_tensor_release(cur);
        *g = fixed;
    }
    return TD_OK;
}

/* ---- a graph task ----------------------------------------------------------------------------- */

static void discover(workspace *ws, const ag_task_spec *spec)
{
    int top = 0;
    for (int i = 0; i < spec->num_roots; i++) {
        if (!spec->roots[i].node)
            continue;
        bool added;
        slot_of(ws, spec->roots[i].node, &added);
        if (added) {
            grow_array((void **)&ws->stack, &ws->stack_cap, top + 1, sizeof(td_autograd_node *));
            ws->stack[top++] = spec->roots[i].node;
        }
    }
    while (top > 0) {
        td_autograd_node *node = ws->stack[--top];
        for (int j = 0; j < node->num_next; j++) {
            td_autograd_node *next = node->next[j].node;
            if (!next)
                continue;
            bool added;
            int s = slot_of(ws, next, &added);
            ws->slots[s].deps++;
            if (added) {
                grow_array((void **)&ws->stack, &ws->stack_cap, top + 1, sizeof(td_autograd_node *));
                ws->stack[top++] = next;
            }
        }
    }
}

td_status ag_engine_execute(const ag_task_spec *spec)
{
    workspace *ws = ws_acquire();
    td_status st = TD_OK;
    discover(ws, spec);
    for (int i = 0; i < spec->num_roots; i++) {
        td_tensor *g = spec->grads[i];
        spec->grads[i] = NULL;
        if (!spec->roots[i].node || !g) {
            td_tensor_release(g);
            continue;
        }
        int s = slot_find(ws, spec->roots[i].node);
        if (st == TD_OK)
            st = ag_buffer_add(&ws->bufs[ws->slots[s].buf + spec->roots[i].input_nr], g);
        else
            td_tensor_release(g);
    }
    for (int i = 0; i < spec->num_roots && st == TD_OK; i++) {
        if (!spec->roots[i].node)
            continue;
        int s = slot_find(ws, spec->roots[i].node);
        if (ws->slots[s].deps == 0) {
            ws->slots[s].deps = -1; /* queued */
            heap_push(ws, s);
        }
    }
    while (ws->heap_len > 0 && st == TD_OK) {
        int s = heap_pop(ws);
        td_autograd_node *node = ws->slots[s].node;
        int nb = ws->slots[s].buf;
        grow_array((void **)&ws->outs, &ws->outs_cap, node->num_next, sizeof(td_tensor *));
        td_tensor **outs = ws->outs;
        memset(outs, 0, sizeof(td_tensor *) * (size_t)node->num_next);
        st = run_node(spec, node, ws->bufs + nb, outs);
        if (!spec->retain_graph && !ag_node_is_accumulator(node))
            ag_node_release_saved(node);
        for (int i = 0; i < node->num_outputs; i++) {
            td_tensor_release(ws->bufs[nb + i]);
            ws->bufs[nb + i] = NULL;
        }
        for (int j = 0; j < node->num_next; j++) {
            td_tensor *g = outs[j];
            const ag_edge *e = &node->next[j];
            if (!e->node || st != TD_OK) {
                td_tensor_release(g);
                continue;
            }
            int t = slot_find(ws, e->node);
            if (g) {
                st = fit_gradient(node, j, &g);
                if (st == TD_OK)
                    st = ag_buffer_add(&ws->bufs[ws->slots[t].buf + e->input_nr], g);
                else
                    td_tensor_release(g);
            }
            if (--ws->slots[t].deps == 0) {
                ws->slots[t].deps = -1;
                heap_push(ws, t);
            }
        }
    }
    for (int i = 0; i < ws->bufs_len; i++) { /* what a failed pass left behind */
        td_tensor_release(ws->bufs[i]);
        ws->bufs[i] = NULL;
    }
    ws_return(ws);
    return st;
}

/* ---- backward() and grad() -------------------------------------------------------------------- */

static void format_size(char *buf, size_t len, const td_tensor *t)
{
    char b[256];
    snprintf(buf, len, "torch.Size(%s)", tensor_format_sizes(b, sizeof b, t->ndim, t->sizes));
}

/* The roots of a pass: each output's edge and its starting gradient (given, or 1 for a one-element
 * output), with PyTorch's checks. */
static td_status make_roots(td_tensor *const *tensors, td_tensor *const *grads, int n, ag_edge *roots,
                            td_tensor **root_grads)
{
    for (int i = 0; i < n; i++) {
        td_tensor *t = tensors[i];
        if (!t)
            return error_fmt(TD_ERR_INVALID, "backward: tensor %d is NULL", i);
        if (!ag_requires_grad(t))
            return error_fmt(TD_ERR_INVALID, "element %d of tensors does not require grad and does not have a grad_fn",
                             i);
        td_tensor *g = grads ? grads[i] : NULL;
        if (g) {
            if (!strided_same_sizes(g, t)) {
                char b1[300], b2[300];
                format_size(b1, sizeof b1, g);
                format_size(b2, sizeof b2, t);
                return error_fmt(TD_ERR_INVALID, "Mismatch in shape: grad_output[%d] has a shape of %s and output[%d] "
                                                 "has a shape of %s.",
                                 i, b1, i, b2);
            }
            if (g->dtype != t->dtype)
                TD_TRY(td_tensor_to(g, t->dtype, &root_grads[i]));
            else
                root_grads[i] = td_tensor_retain(g);
        } else {
            if (td_tensor_numel(t) != 1)
                return error_fmt(TD_ERR_INVALID, "grad can be implicitly created only for scalar outputs");
            TD_TRY(td_tensor_ones(t->dtype, td_tensor_shape(t), &root_grads[i]));
        }
        roots[i] = ag_gradient_edge(t);
    }
    return TD_OK;
}

static void release_edges(ag_edge *edges, int n)
{
    for (int i = 0; i < n; i++)
        ag_node_release(edges[i].node);
}

td_status td_autograd_backward_many(td_tensor *const *tensors, td_tensor *const *grads, int n, bool retain_graph)
{
    if (n <= 0 || !tensors)
        return error_fmt(TD_ERR_INVALID, "backward: needs at least one tensor");
    ag_edge *roots = TD_NEW_ARRAY(ag_edge, (size_t)n);
    td_tensor **root_grads = TD_NEW_ARRAY(td_tensor *, (size_t)n);
    td_status st = make_roots(tensors, grads, n, roots, root_grads);
    if (st == TD_OK) {
        ag_task_spec spec = {.roots = roots, .grads = root_grads, .num_roots = n, .retain_graph = retain_graph,
                             .accumulate = true};
        st = ag_engine_execute(&spec);
    }
    for (int i = 0; i < n; i++)
        td_tensor_release(root_grads[i]);
    release_edges(roots, n);
    free(roots);
    free(root_grads);
    return st;
}

td_status td_autograd_backward(td_tensor *tensor, td_tensor *gradient, bool retain_graph)
{
    return td_autograd_backward_many(&tensor, gradient ? &gradient : NULL, 1, retain_graph);
}

td_status td_autograd_grad(td_tensor *const *outputs, td_tensor *const *grad_outputs, int n_outputs,
                           td_tensor *const *inputs, int n_inputs, bool retain_graph, bool allow_unused,
                           td_tensor **grads_out)
{
    if (n_outputs <= 0 || !outputs || n_inputs <= 0 || !inputs || !grads_out)
        return error_fmt(TD_ERR_INVALID, "grad: needs outputs, inputs and grads_out");
    for (int i = 0; i < n_inputs; i++) {
        grads_out[i] = NULL;
        if (!inputs[i] || !ag_requires_grad(inputs[i]))
            return error_fmt(TD_ERR_INVALID, "One of the differentiated Tensors does not require grad");
    }
    ag_edge *roots = TD_NEW_ARRAY(ag_edge, (size_t)n_outputs);
    ag_edge *wanted = TD_NEW_ARRAY(ag_edge, (size_t)n_inputs);
    td_tensor **root_grads = TD_NEW_ARRAY(td_tensor *, (size_t)n_outputs);
    td_status st = make_roots(outputs, grad_outputs, n_outputs, roots, root_grads);
    for (int i = 0; i < n_inputs; i++)
        wanted[i] = ag_gradient_edge(inputs[i]);
    if (st == TD_OK) {
        ag_task_spec spec = {.roots = roots, .grads = root_grads, .num_roots = n_outputs,
                             .retain_graph = retain_graph, .accumulate = false, .capture_edges = wanted,
                             .captures = grads_out, .num_captures = n_inputs};
        st = ag_engine_execute(&spec);
    }
    for (int i = 0; st == TD_OK && i < n_inputs; i++) {
        if (!grads_out[i] && !allow_unused)
            st = error_fmt(TD_ERR_INVALID, "One of the differentiated Tensors appears to not have been used in the "
                                           "graph. Set allow_unused=True if this is the desired behavior.");
    }
    if (st != TD_OK) {
        for (int i = 0; i < n_inputs; i++) {
            td_tensor_release(grads_out[i]);
            grads_out[i] = NULL;
        }
    }
    for (int i = 0; i < n_outputs; i++)
        td_tensor_release(root_grads[i]);
    release_edges(roots, n_outputs);
    release_edges(wanted, n_inputs);
    free(roots);
    free(wanted);
    free(root_grads);
    return st;
}
