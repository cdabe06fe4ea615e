/* The auto backend's routing transports (auto_route.h): a view of some ranks of a transport, and
 * a composite that sends each peer's messages through shared memory or tcp. Both hand every xfer
 * straight to the transport that carries it and wait through it; an xfer keeps the peer it was
 * posted to (the shm transport does not renumber a specific peer, and the tcp transport numbers
 * peers as the group does), which is how wait finds its transport again. */
#include "backends/auto_route.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

/* ---- view -------------------------------------------------------------------------------------- */

typedef struct view {
    td_transport base;
    td_transport *parent;
    int *map;
} view;

static td_status view_isend(td_transport *t, int peer, td_xfer *x)
{
    view *v = (view *)t;
    return v->parent->ops->isend(v->parent, v->map[peer], x);
}

static td_status view_irecv(td_transport *t, int peer, td_xfer *x)
{
    view *v = (view *)t;
    if (peer == TD_TRANSPORT_ANY)
        return error_fmt(TD_ERR_UNSUPPORTED, "a view transport takes no any-source receives");
    return v->parent->ops->irecv(v->parent, v->map[peer], x);
}

static td_status view_wait(td_transport *t, td_xfer *x, int64_t deadline_ns)
{
    view *v = (view *)t;
    return v->parent->ops->wait(v->parent, x, deadline_ns);
}

static void view_abort(td_transport *t, td_status status, const char *message)
{
    view *v = (view *)t;
    transport_abort(v->parent, status, message);
}

static void view_destroy(td_transport *t)
{
    view *v = (view *)t;
    free(v->map);
    free(v);
}

static const td_transport_ops view_ops = {
    .name = "view",
    .isend = view_isend,
    .irecv = view_irecv,
    .wait = view_wait,
    .abort = view_abort,
    .destroy = view_destroy,
};

td_transport *auto_view_transport_new(td_transport *parent, int rank, int n, const int *map)
{
    view *v = TD_NEW(view);
    v->base.ops = &view_ops;
    v->base.rank = rank;
    v->base.size = n;
    v->parent = parent;
    v->map = TD_NEW_ARRAY(int, (size_t)n);
    memcpy(v->map, map, sizeof(int) * (size_t)n);
    return &v->base;
}

void auto_view_transport_remap(td_transport *t, const int *map)
{
    view *v = (view *)t;
    memcpy(v->map, map, sizeof(int) * (size_t)t->size);
}

/* ---- composite --------------------------------------------------------------------------------- */

typedef struct composite {
    td_transport base;
    td_transport *local, *remote;
    int *local_index;
} composite;

static td_status comp_isend(td_transport *t, int peer, td_xfer *x)
{
    composite *c = (composite *)t;
    int l = c->local_index[peer];
    return l >= 0 ? c->local->ops->isend(c->local, l, x) : c->remote->ops->isend(c->remote, peer, x);
}

static td_status comp_irecv(td_transport *t, int peer, td_xfer *x)
{
    composite *c = (composite *)t;
    if (peer == TD_TRANSPORT_ANY)
        return error_fmt(TD_ERR_UNSUPPORTED, "the auto backend's collective transport takes no any-source receives");
    int l = c->local_index[peer];
    return l >= 0 ? c->local->ops->irecv(c->local, l, x) : c->remote->ops->irecv(c->remote, peer, x);
}

static td_status comp_wait(td_transport *t, td_xfer *x, int64_t deadline_ns)
{
    composite *c = (composite *)t;
    if (xfer_done(x))
        return xfer_result(x);
    bool local = x->peer >= 0 && x->peer < t->size && c->local_index[x->peer] >= 0;
    return local ? c->local->ops->wait(c->local, x, deadline_ns) : c->remote->ops->wait(c->remote, x, deadline_ns);
}

static void comp_abort(td_transport *t, td_status status, const char *message)
{
    composite *c = (composite *)t;
    if (c->local)
        transport_abort(c->local, status, message);
    transport_abort(c->remote, status, message);
}

static void comp_destroy(td_transport *t)
{
    composite *c = (composite *)t;
    free(c->local_index);
    free(c);
}

static const td_transport_ops composite_ops = {
    .name = "composite",
    .isend = comp_isend,
    .irecv = comp_irecv,
    .wait = comp_wait,
    .abort = comp_abort,
    .destroy = comp_destroy,
};

td_transport *auto_composite_transport_new(td_transport *local, td_transport *remote, int rank, int size,
                                         const int *local_index)
{
    composite *c = TD_NEW(composite);
    c->base.ops = &composite_ops;
    c->base.rank = rank;
    c->base.size = size;
    c->local = local;
    c->remote = remote;
    c->local_index = TD_NEW_ARRAY(int, (size_t)size);
    memcpy(c->local_index, local_index, sizeof(int) * (size_t)size);
    return &c->base;
}
