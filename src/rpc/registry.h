/* The process's function registry: name to C function, shared by every agent of the process
 * (tdist/rpc.h, td_rpc_register), and the builtin tensor functions the library registers in it
 * ("aten::add", ...; builtins.c). Lookups copy the entry under the registry's lock, so a function
 * may be unregistered while a call to it runs elsewhere. */
#ifndef TDIST_RPC_REGISTRY_H
#define TDIST_RPC_REGISTRY_H

#include <stdbool.h>

#include <tdist/rpc.h>

typedef struct rpc_function {
    td_rpc_fn fn;             /* one of fn and async_fn is set */
    td_rpc_async_fn async_fn;
    void *arg;
} rpc_function;

/* The function registered as name (the builtins included); false when there is none. */
bool rpc_registry_lookup(const char *name, rpc_function *out);
/* Registers the builtin tensor functions once per process (idempotent; thread-safe). */
void rpc_builtins_register(void);

#endif
