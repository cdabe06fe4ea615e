/* Internal: a live C object carried inside a td_value (handle.c). Layers that let their objects
 * travel in values (mp queues and events, RPC's RRefs) put a handle in a field of their record; the
 * value then holds a reference to the object for as long as it lives, whatever copies of it are
 * made. A handle is a 0-element tensor over a 0-byte storage whose free releases the object: the
 * codec would send it as an empty tensor, so those layers replace their records before encoding. */
#ifndef TDIST_TENSOR_HANDLE_H
#define TDIST_TENSOR_HANDLE_H

#include <tdist/value.h>

/* A value holding obj (the handle takes the caller's reference: release(obj) runs when the last
 * value holding it goes). kind is an identity token of the caller's (the address of a static). */
td_value *value_handle_new(const void *kind, void *obj, void (*release)(void *obj));
/* The object a handle value holds when it is one of kind; NULL otherwise (borrowed). */
void *value_handle_get(const td_value *v, const void *kind);

#endif
