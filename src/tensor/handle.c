/* Handles (handle.h): a C object held by a td_value, as a 0-element tensor over a 0-byte storage
 * whose allocator context is the object; the storage's free (its last reference) releases it. */
#include "tensor/handle.h"

#include <stdlib.h>

#include "base/alloc.h"
#include "tensor/storage.h"

typedef struct handle {
    const void *kind;
    void *obj;
    void (*release)(void *obj);
} handle;

static void handle_free(void *data, size_t nbytes, void *ctx)
{
    (void)data;
    (void)nbytes;
    handle *h = ctx;
    h->release(h->obj);
    free(h);
}

static const td_storage_allocator handle_allocator = {.kind = TD_STORAGE_EXTERNAL, .name = "handle", .free = handle_free};

td_value *value_handle_new(const void *kind, void *obj, void (*release)(void *obj))
{
    handle *h = TD_NEW(handle);
    h->kind = kind;
    h->obj = obj;
    h->release = release;
    td_storage *s = storage_new_with(NULL, 0, (td_device){TD_DEVICE_CPU, -1}, &handle_allocator, h, false);
    td_tensor *t = NULL;
    td_status st = td_tensor_from_storage(s, 0, TD_UINT8, TD_SHAPE(0), NULL, &t);
    td_storage_release(s);
    if (st != TD_OK)
        abort(); /* a 0-element view of a 0-byte storage cannot fail */
    td_value *v = td_value_tensor(t);
    td_tensor_release(t);
    return v;
}

void *value_handle_get(const td_value *v, const void *kind)
{
    if (!v || td_value_kind_of(v) != TD_VAL_TENSOR)
        return NULL;
    td_storage *s = td_tensor_storage(td_value_get_tensor(v));
    if (!s || s->allocator != &handle_allocator)
        return NULL;
    handle *h = s->allocator_ctx;
    return h->kind == kind ? h->obj : NULL;
}
