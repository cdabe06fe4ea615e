/* Internal: the backends built into libtdist, for the registry in src/pg/registry.c.
 *
 * Each built-in backend defines one `const td_backend_ops` here under its name. The declarations
 * are weak so that the registry builds before a backend's file exists: a backend that is not
 * linked in has a NULL address and is simply not registered. Adding a built-in backend: define its
 * ops in src/backends/<name>.c, declare it below, and add it to the table in registry.c. */
#ifndef TDIST_BACKENDS_BUILTIN_H
#define TDIST_BACKENDS_BUILTIN_H

#include <tdist/backend.h>

extern const td_backend_ops td_backend_threaded_ops __attribute__((weak)); /* threaded.c */
extern const td_backend_ops td_backend_tcp_ops __attribute__((weak));      /* tcp.c */

#endif
